"""Training plans: purchase, lifecycle, payments, extensions, quotas, usage, tags, capacity claims. Imports
services/webhooks, storage, runtime, accounts."""
