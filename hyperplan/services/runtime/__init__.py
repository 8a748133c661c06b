"""What every service works with: the context and what it holds (shared state, rate limits, exec slots,
console sessions, the Slurm client and placement, the live calendar, job locks), status moves, the drain flag,
leadership, tenancy, the fleet. Imports only services/accounts."""
