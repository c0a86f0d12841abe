"""The one version number of pulse: this package's, the library's and its
headers' (CMakeLists.txt reads it from this line for project(VERSION); pip
reads it for the package's metadata). The package loads only a libpulse
whose pulse_version() says the same."""

__version__ = "0.1.0"
