"""The tool subcommands of ``kubelet-dra-health``, one module each.

- :mod:`~kubelet_dra.commands.demo`: ``demo``, the whole pipeline on one machine;
- :mod:`~kubelet_dra.commands.watch`: ``watch``, a driver's health stream as a
  kubelet sees it;
- :mod:`~kubelet_dra.commands.cache`: ``cache show``, a health cache (ours or a
  kubelet's ``dra_health_state``) read offline.

``kubelet_dra.cli`` is the command itself (parser, logging, signals, the
``run`` sidecar) and registers these. Imports go one way: a command uses the
library, the library never imports a command. All of it is private: the
command line is public through its flags, environment variables and exit
codes. No kubelet counterpart (the kubelet has no such tools).
"""
