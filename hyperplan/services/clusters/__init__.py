"""HyperPod clusters: requests, records, groups, nodes and their watcher, reconciliation, exec, metering.
Imports services/plans and below."""
