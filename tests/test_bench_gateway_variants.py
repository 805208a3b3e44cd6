"""bench/gateway.py's variants are what they say: each one a configuration the real HAProxy accepts (a variant it
refuses stops the whole bench: "no body buffering" once left a rule naming an ACL it had taken out), and each one
differs from the rendered configuration (a variant whose edit no longer matches the rendered text would measure the
rendered gateway twice under another name)."""

from __future__ import annotations

import subprocess
from collections import Counter
from itertools import pairwise
from pathlib import Path

import pytest

from bench.gateway import KEY, order_of, paired_ratio, variants
from bench.gateway_instructions import dumped_total
from engine_ctl.core.documents.apikey import key_sha256
from engine_ctl.core.documents.inventory import Host
from engine_ctl.core.model import ApiKey
from engine_ctl.core.render.gateway import GatewayBackend, GatewayServer, render_gateway
from tests.test_gateway_loopback import HAPROXY


def rendered(folder: Path) -> str:
    host = Host(name="bench", address="127.0.0.1", gateway_port=18000)
    server = GatewayServer(name="r0a", address="127.0.0.1", port=18001, maxconn=8)
    files = render_gateway(host, [GatewayBackend(deployment="bench", servers=(server,))],
                           [ApiKey(name="bench", sha256=key_sha256(KEY))], internal_key=False, run_dir=str(folder),
                           metrics_port=18002).files  # fmt: skip
    for name, text in files.items():
        (folder / name).write_text(text)
    return files["haproxy.cfg"]


@pytest.mark.parametrize("name", list(variants("")))
def test_each_variant_is_a_configuration_haproxy_accepts(tmp_path: Path, name: str) -> None:
    config = rendered(tmp_path)
    text = variants(config)[name]
    assert name == "rendered" or text != config, f"the variant {name!r} no longer changes the configuration"
    (tmp_path / "variant.cfg").write_text(text)
    check = subprocess.run([HAPROXY, "-c", "-q", "-f", str(tmp_path / "variant.cfg")], capture_output=True,
                           text=True, cwd=tmp_path, check=False)  # fmt: skip
    assert check.returncode == 0, (name, check.stdout + check.stderr)


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_the_rounds_put_each_path_in_each_place_equally_often(n: int) -> None:
    """The bench's order over 2n rounds: each path in each place twice; with up to three paths each path also
    follows each other one equally often (the control and the gateway see the same neighbours)."""
    paths = [f"p{i}" for i in range(n)]
    orders = [order_of(paths, r) for r in range(2 * n)]
    assert all(sorted(o) == paths for o in orders)
    places = Counter((p, i) for o in orders for i, p in enumerate(o))
    assert set(places.values()) == {2} and len(places) == n * n
    follows = Counter(pair for o in orders for pair in pairwise(o))
    if n <= 3:
        assert len(follows) == n * (n - 1) and len(set(follows.values())) == 1


@pytest.mark.parametrize("cores", [(1.0, 1.0), (1.0, 0.8), (0.7, 1.3)])
@pytest.mark.parametrize("drift", [(1.0, 1.0), (1.0, 0.6), (1.4, 0.9)])
def test_the_paired_ratio_cancels_each_cores_speed_and_the_drift_of_the_machine(
    cores: tuple[float, float], drift: tuple[float, float]
) -> None:
    """--paired: a path's rate is its efficiency x its core's speed x the machine's speed in that slice; the ratio
    of the two slices (x on core 0 beside y on core 1, then swapped) is x's efficiency over y's, whatever the cores
    and the drift between the slices. Without the swap (the first slice alone) the cores' difference would stay."""
    x, y = 0.95, 1.0
    first = (x * cores[0] * drift[0], y * cores[1] * drift[0])
    second = (y * cores[0] * drift[1], x * cores[1] * drift[1])
    assert paired_ratio(first, second) == pytest.approx(x / y)
    # the control: two paths that differ in nothing
    control = paired_ratio((cores[0] * drift[0], cores[1] * drift[0]), (cores[0] * drift[1], cores[1] * drift[1]))
    assert control == pytest.approx(1.0)
    if cores[0] != cores[1]:
        assert first[0] / first[1] != pytest.approx(x / y)


def test_the_instructions_are_read_from_callgrinds_summary_line() -> None:
    """bench/gateway_instructions.py's figure: a dump's `summary:` line (valgrind 3.19's), or `totals:`."""
    dump = "version: 1\ncreator: callgrind-3.19.0\nevents: Ir\nfl=(1) x.c\nfn=(1) main\n3 17\nsummary: 26124223\n"
    assert dumped_total(dump) == 26124223
    assert dumped_total(dump.replace("summary:", "totals:")) == 26124223
    with pytest.raises(ValueError):
        dumped_total("events: Ir\n3 17\n")
