"""Timed events: the persisted transitions of the service that fall due at an instant (a plan's start,
a payment's deadline, a job's runtime cap), and the one loop that runs them in order (`loop.py`)."""
