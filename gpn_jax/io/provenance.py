"""What code wrote a file: installed package versions (read by the run info, the export and
the results files)."""


def installed_version(distribution: str, missing: str | None = None) -> str | None:
    """The installed version of `distribution`, `missing` where it is not installed."""
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return missing


def package_version() -> str:
    """The installed gpn_jax version (setup.cfg's), or 'unknown' for an uninstalled checkout."""
    return installed_version("gpn_jax", "unknown")
