"""What the kit gives before any driver runs: short socket paths, settings in them."""

import os

from kubelet_dra import Role, Settings
from kubelet_dra.testing import eventually_sync


def test_socket_paths_fit_in_sun_path(kdra_sockdir, kdra_registry):
    longest = kdra_registry / f"{'d' * 63}-reg.sock"
    assert len(os.fsencode(longest)) < 108
    assert kdra_registry.parent == kdra_sockdir and kdra_registry.is_dir()


def test_settings_are_rooted_in_the_socket_dir(kdra_settings, kdra_sockdir):
    assert isinstance(kdra_settings, Settings)
    assert kdra_settings.plugins_registry == kdra_sockdir / "reg"
    assert kdra_settings.state_dir.parent == kdra_sockdir
    assert kdra_settings.kubelet_root_dir is None
    assert kdra_settings.pod_resources_socket is None
    assert kdra_settings.role is Role.OWNER


def test_a_missing_key_is_not_yet():
    seen = {}
    calls = []

    def ready():
        calls.append(1)
        if len(calls) == 3:
            seen["ready"] = True
        return seen["ready"]

    assert eventually_sync(ready, interval=0) is True
