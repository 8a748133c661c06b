"""What spans the entities: adoption at start, drain, retention, account deletion and the admin views of
accounts, users and audit, the console's views, fleet metrics, the service clock, the demo load. Imports every
other services package."""
