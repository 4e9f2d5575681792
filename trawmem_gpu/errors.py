"""Errors the package raises on bad input: one message that names where and what."""


class TrawmemError(Exception):
    """Base class of every error this package raises on purpose."""


class InputError(TrawmemError, ValueError):
    """Malformed input data; the message names the file, line or sample, and the field."""


class BankError(TrawmemError):
    """A bank directory is missing, corrupt, truncated or of another format version."""


class ConfigError(TrawmemError, ValueError):
    """An invalid configuration value."""


class NoLLMConfigured(TrawmemError, RuntimeError):
    """An LLM-backed path was asked for but no LLM backend is configured."""
