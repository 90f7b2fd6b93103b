"""`kvqual audit`: judge outputs a config already produced, without generating them again (docs/audit.md)."""
