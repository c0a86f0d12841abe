"""The version of pulse: the library's, the headers' and this package's
(CMakeLists.txt's project(VERSION) must say the same: configuring checks)."""

__version__ = "0.1.0"
