"""Framework-neutral parts of Horovod shared by every framework package: the engine's basics and
collectives (through the compiled ``horovod.common._core``), process sets, exceptions, the
rendezvous store service, and utilities."""
