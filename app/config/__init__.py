"""The service's configuration: pydantic models for the YAML file, one module per part of it (common rules, a
model, the service, the whole file). Every model forbids unknown keys, so a typo is an error at load time that
names the key, never a setting silently ignored."""
