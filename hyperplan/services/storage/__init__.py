"""Buckets and the rights to them (who may read or write which bucket, the served S3 buckets). Imports
services/runtime and services/accounts."""
