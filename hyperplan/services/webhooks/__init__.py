"""Webhooks: plan events queued in the plan's transaction, signed; the admin's views. Imports services/runtime
and services/accounts."""
