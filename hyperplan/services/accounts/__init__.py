"""Who calls: accounts, users and their keys, OS identities, the audit trail; the bottom of the services
(imports no other services package)."""
