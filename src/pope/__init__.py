from pope.version import __version__
