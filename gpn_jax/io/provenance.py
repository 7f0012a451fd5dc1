"""What code wrote a file: the installed package version (read by the run info and the export)."""


def package_version() -> str:
    """The installed gpn_jax version (setup.cfg's), or 'unknown' for an uninstalled checkout."""
    from importlib import metadata

    try:
        return metadata.version("gpn_jax")
    except metadata.PackageNotFoundError:
        return "unknown"
