"""Region directories: who is in the fleet (a static regions file, or Consul)."""

from gateway.discovery.build import build_region_directory
from gateway.discovery.consul import ConsulDirectoryConfig, ConsulRegionDirectory
from gateway.discovery.interface import RegionDirectory
from gateway.discovery.static import StaticDirectory

__all__ = [
    "ConsulDirectoryConfig",
    "ConsulRegionDirectory",
    "RegionDirectory",
    "StaticDirectory",
    "build_region_directory",
]
