"""The tool subcommands of ``kubelet-dra-health``, one module each: ``demo`` (the whole
pipeline on one machine), ``watch`` (a driver's health stream as a kubelet sees it) and
``cache`` (``cache show``: a health cache, ours or a kubelet's, read offline).

``kubelet_dra.cli`` is the command itself and registers these. Imports go one way: a command
uses the library, the library never imports a command. No kubelet counterpart (the kubelet
has no such tools).
"""
