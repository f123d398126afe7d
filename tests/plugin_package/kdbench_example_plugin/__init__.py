"""An example kdbench plug-in package (see tests/plugin_package/pyproject.toml)."""
