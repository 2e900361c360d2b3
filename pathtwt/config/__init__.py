"""Workflow configuration: schema validation and checks of label tables and slides."""
