"""Training jobs: requests, records, queue, launch, attempts, the runner and watcher, logs. Imports
services/clusters and below."""
