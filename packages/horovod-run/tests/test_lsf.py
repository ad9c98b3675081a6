"""LSF and jsrun (runner.md §5.6): the allocation LSFUtils reads, the ERF rankfile and the jsrun
command js_run writes, horovodrun's LSF defaults, and jobs started by a jsrun across the test
bed's hosts.

No LSF exists here. The allocation is given through LSF's job variables (``LSB_JOBID``,
``LSB_MCPU_HOSTS``), CSM through stand-in query scripts, and jsrun through tests/lsf/jsrun: a
stand-in that checks the ERF against IBM's format and starts each rank, with Open MPI's mpirun
and a rankfile made from the ERF, on the host and hardware threads its ERF line names (see that
file for what it does and does not do). The bed tests check that every rank runs on the host the
ERF gives it, bound to its share of threads, and that an allreduce across the hosts equals
numpy's sum.
"""

import json
import os
import pathlib
import re
import socket
import subprocess
import sys
import textwrap
from unittest import mock

import pytest

from horovod.runner import _HorovodArgs, js_run as js_mod, launch
from horovod.runner.common.util import settings as hvd_settings
from horovod.runner.js_run import generate_jsrun_rankfile, js_run
from horovod.runner.util import lsf
from horovod.runner.util.lsf import LSFUtils

STANDIN_DIR = pathlib.Path(__file__).resolve().parent / "lsf"
LSF_VARIABLES = ("LSB_JOBID", "LSB_MCPU_HOSTS", "LSB_DJOB_HOSTFILE", "LSB_HOSTS",
                 "CSM_ALLOCATION_ID")
OMPI_FLAGS = "-mca pml ob1 -mca btl ^openib"


@pytest.fixture(autouse=True)
def _no_lsf(monkeypatch):
    """Every test starts outside an LSF job, with no allocation read yet."""
    for name in LSF_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(LSFUtils, "_allocation_info", None)


def _allocation(gpus, cores=4, threads=4):
    return mock.patch.multiple(LSFUtils, get_num_gpus=mock.MagicMock(return_value=gpus),
                               get_num_cores=mock.MagicMock(return_value=cores),
                               get_num_threads=mock.MagicMock(return_value=threads))


# The ERF rankfile.

def test_rankfile_upstream_layout(tmp_path):
    settings = hvd_settings.Settings(num_proc=5, hosts="host1:4,host2:4,host3:4")
    with _allocation(gpus=4):
        path = generate_jsrun_rankfile(settings, str(tmp_path / "erf"))
    assert path == str(tmp_path / "erf")
    assert pathlib.Path(path).read_text() == textwrap.dedent("""\
        overlapping_rs: allow
        cpu_index_using: logical

        rank: 0: { hostname: host1; cpu: {0-3} ; gpu: * ; mem: * }
        rank: 1: { hostname: host1; cpu: {4-7} ; gpu: * ; mem: * }
        rank: 2: { hostname: host1; cpu: {8-11} ; gpu: * ; mem: * }
        rank: 3: { hostname: host1; cpu: {12-15} ; gpu: * ; mem: * }

        rank: 4: { hostname: host2; cpu: {0-3} ; gpu: * ; mem: * }
        """)


def test_rankfile_without_gpus_has_a_rank_per_core_in_tmpdir(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    settings = hvd_settings.Settings(num_proc=3, hosts="a:2,b:1")
    with _allocation(gpus=0, cores=2, threads=2):
        path = generate_jsrun_rankfile(settings)
    assert os.path.dirname(path) == str(tmp_path)
    assert os.path.basename(path).startswith("horovod-jsrun-") and path.endswith(".erf")
    assert pathlib.Path(path).read_text().splitlines()[2:] == [
        "", "rank: 0: { hostname: a; cpu: {0-1} ; gpu: * ; mem: * }",
        "rank: 1: { hostname: a; cpu: {2-3} ; gpu: * ; mem: * }",
        "", "rank: 2: { hostname: b; cpu: {0-1} ; gpu: * ; mem: * }"]


@pytest.mark.parametrize("hosts, np, allocation, message", [
    ("a:3,b:2", 4, dict(gpus=2), r"^host a is given 3 slots, more than the 2 ranks per host"),
    ("a:2,b:2", 5, dict(gpus=2), r"^the hosts a:2,b:2 have fewer slots than the 5 processes"),
    ("a:4", 4, dict(gpus=4, cores=1, threads=2), r"has 2 hardware threads, too few for 4 ranks"),
])
def test_rankfile_errors(tmp_path, hosts, np, allocation, message):
    with _allocation(**allocation), pytest.raises(ValueError, match=message):
        generate_jsrun_rankfile(hvd_settings.Settings(num_proc=np, hosts=hosts),
                                str(tmp_path / "erf"))


# The jsrun command line.

def _js_run(settings, nics=None, env=None, flags=("--mock-mpi-impl-flags",), jsrun=True,
            exit_code=0):
    with mock.patch.object(js_mod, "_get_mpi_implementation_flags",
                           side_effect=lambda tcp, env=None: (
                               None if flags is None else list(flags), [])), \
            mock.patch.object(js_mod, "is_jsrun_installed", return_value=jsrun), \
            mock.patch.object(js_mod, "generate_jsrun_rankfile", return_value="/tmp/rankfile"), \
            mock.patch.object(js_mod.safe_shell_exec, "execute",
                              return_value=exit_code) as execute:
        js_run(settings, nics, {"env1": "val1"} if env is None else env, ["cmd", "arg 1"],
               stdout="<out>", stderr="<err>")
    return execute


def _settings(**kwargs):
    values = dict(verbose=0, num_proc=4, hosts="h1:2,h2:2", run_func_mode=True)
    values.update(kwargs)
    return hvd_settings.Settings(**values)


def test_js_run_upstream_command():
    execute = _js_run(_settings(extra_mpi_args=">mpi-extra args go here<",
                                output_filename=">output filename goes here<"))
    execute.assert_called_once_with(
        "jsrun --erf_input /tmp/rankfile --stdio_stderr >output filename goes here< "
        "--stdio_stdout >output filename goes here< "
        "--smpiargs '--mock-mpi-impl-flags >mpi-extra args go here<' cmd 'arg 1'",
        env={"env1": "val1"}, stdout="<out>", stderr="<err>")


def test_js_run_binding_args_nics_and_empty_placeholders():
    execute = _js_run(_settings(binding_args="-n 4 -a 1 -c 7 -g 1"), nics=["ib0", "eth0"],
                      flags=())
    execute.assert_called_once_with("jsrun -n 4 -a 1 -c 7 -g 1   cmd 'arg 1'",
                                    env={"env1": "val1", "NCCL_SOCKET_IFNAME": "ib0,eth0"},
                                    stdout="<out>", stderr="<err>")
    # A NCCL_SOCKET_IFNAME of the caller wins.
    execute = _js_run(_settings(), nics={"eth0"}, env={"NCCL_SOCKET_IFNAME": "ib1"})
    assert execute.call_args.kwargs["env"] == {"NCCL_SOCKET_IFNAME": "ib1"}


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(exit_code=3), RuntimeError, r"^jsrun failed with exit code 3$"),
    (dict(jsrun=False), Exception, r"^horovodrun could not find the jsrun command"),
    (dict(flags=None), Exception, r"^horovodrun could not find a supported MPI"),
])
def test_js_run_errors(kwargs, error, message):
    with pytest.raises(error, match=message):
        _js_run(_settings(), **kwargs)


def test_js_run_command_mode_execs_jsrun_and_prints_erf(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    settings = _settings(run_func_mode=False, verbose=2, hosts="h1:1", num_proc=1)
    with _allocation(gpus=1, cores=1, threads=1), \
            mock.patch.object(js_mod, "_get_mpi_implementation_flags",
                              return_value=(OMPI_FLAGS.split(" ", 1), [], "OpenMPI")), \
            mock.patch.object(js_mod, "is_jsrun_installed", return_value=True), \
            mock.patch.object(js_mod.os, "execve") as execve:
        js_run(settings, None, {"A": "1"}, ["cmd"])
    (rankfile,) = os.listdir(tmp_path)
    command = "jsrun --erf_input %s  --smpiargs '%s' cmd" % (tmp_path / rankfile, OMPI_FLAGS)
    execve.assert_called_once_with("/bin/sh", ["/bin/sh", "-c", command], {"A": "1"})
    assert capsys.readouterr().out == (tmp_path / rankfile).read_text() + command + "\n"


# The allocation.

def _fake_query(threads=2, gpus=0):
    return mock.patch.object(lsf, "_query_host", return_value=(threads, gpus))


@pytest.mark.parametrize("mcpu_hosts, hosts, cores", [
    # CORAL: the launch node comes first with one slot.
    ("batch3 1 a01n01 42 a01n02 42", ["a01n01", "a01n02"], 42),
    # A plain LSF job runs on its first host, which computes too.
    ("hostA 4 hostB 4", ["hostA", "hostB"], 4),
    ("hostA 1", ["hostA"], 1),
    ("hostA 1 hostB 1", ["hostA", "hostB"], 1),
])
def test_allocation_from_lsb_mcpu_hosts(monkeypatch, mcpu_hosts, hosts, cores):
    monkeypatch.setenv("LSB_JOBID", "1")
    monkeypatch.setenv("LSB_MCPU_HOSTS", mcpu_hosts)
    with _fake_query(threads=4, gpus=0) as query:
        assert LSFUtils.get_compute_hosts() == hosts
        assert (LSFUtils.get_num_cores(), LSFUtils.get_num_threads()) == (cores, 4)
        assert (LSFUtils.get_num_gpus(), LSFUtils.get_slots_per_host()) == (0, cores)
        assert LSFUtils.get_num_processes() == cores * len(hosts)
        assert LSFUtils.get_hosts_argument() == ",".join("%s:%d" % (h, cores) for h in hosts)
    query.assert_called_once_with(hosts[0])


def test_allocation_from_host_lists(monkeypatch, tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("login1\nh1\nh1\nh1\nh2\nh2\nh2\n")
    monkeypatch.setenv("LSB_DJOB_HOSTFILE", str(hostfile))
    with _fake_query(threads=1, gpus=6):
        assert LSFUtils.get_hosts_argument() == "h1:6,h2:6"
        assert LSFUtils.get_num_cores() == 3
    monkeypatch.setattr(LSFUtils, "_allocation_info", None)
    monkeypatch.delenv("LSB_DJOB_HOSTFILE")
    monkeypatch.setenv("LSB_HOSTS", "h1 h1 h2 h2")
    with _fake_query(threads=1, gpus=0):
        assert LSFUtils.get_hosts_argument() == "h1:2,h2:2"


def test_allocation_errors(monkeypatch):
    with pytest.raises(RuntimeError, match="cannot find the hosts of this LSF job"):
        LSFUtils.get_compute_hosts()
    monkeypatch.setenv("LSB_MCPU_HOSTS", "h1 2 h2")
    with pytest.raises(ValueError, match="not a list of '<host> <slots>' pairs"):
        LSFUtils.get_compute_hosts()


def test_allocation_from_csm(monkeypatch, tmp_path):
    """CSM's query commands (stand-ins printing the YAML CSM prints) name the nodes; usable cores
    are the node's cores less the isolated cores of each socket."""
    allocation = tmp_path / "csm_allocation_query"
    allocation.write_text('#!/bin/sh\n[ "$1 $2" = "-a 77" ] || exit 9\n'
                          'printf "compute_nodes:\\n- n02\\n- n01\\nisolated_cores: 1\\n"\n')
    node = tmp_path / "csm_node_attributes_query"
    node.write_text('#!/bin/sh\n[ "$1 $2" = "-n n01" ] || exit 9\nprintf "Record_1:\\n'
                    '  discovered_cores: 44\\n  discovered_sockets: 2\\n  discovered_gpus: 6\\n"\n')
    for script in (allocation, node):
        script.chmod(0o755)
    monkeypatch.setattr(LSFUtils, "CSM_ALLOCATION_QUERY", str(allocation))
    monkeypatch.setattr(LSFUtils, "CSM_NODE_QUERY", str(node))
    monkeypatch.setenv("CSM_ALLOCATION_ID", "77")
    with _fake_query(threads=4, gpus=0):
        info = LSFUtils.get_allocation_info()
    assert info == {"source": "csm", "compute_nodes": ["n01", "n02"], "compute_node_cores": 42,
                    "compute_node_gpus": 6, "compute_node_threads": 4}
    monkeypatch.setattr(LSFUtils, "_allocation_info", None)
    monkeypatch.setenv("CSM_ALLOCATION_ID", "78")
    with pytest.raises(RuntimeError, match="csm_allocation_query -a 78 failed with exit code 9"):
        LSFUtils.get_allocation_info()


def test_query_host_reads_lscpu_and_nvidia_smi_here(tmp_path, monkeypatch):
    """This host is queried without ssh; GPUs are the ``GPU n:`` lines of ``nvidia-smi -L``."""
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=True,
                           env=dict(os.environ, LC_ALL="C")).stdout
    threads = int(re.search(r"^Thread\(s\) per core:\s*(\d+)", lscpu, re.M).group(1))
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'GPU 0: H200 (UUID: GPU-1)'\n"
                    "echo 'GPU 1: H200 (UUID: GPU-2)'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (tmp_path, os.environ["PATH"]))
    assert lsf._query_host(socket.gethostname()) == (threads, 2)
    fake.unlink()
    assert lsf._query_host("127.0.0.1") == (threads, 0)


# horovodrun's defaults inside an LSF job.

def test_np_is_required_only_outside_lsf(monkeypatch):
    with pytest.raises(SystemExit):
        launch.parse_args(["python", "train.py"])
    monkeypatch.setenv("LSB_JOBID", "1")
    assert launch.parse_args(["python", "train.py"]).num_proc is None


@pytest.mark.parametrize("jsrun", [True, False])
def test_run_takes_hosts_and_np_from_the_allocation(monkeypatch, jsrun):
    """As upstream's test_run_with_jsrun: no probe of interfaces; ssh is checked for mpirun
    only, since jsrun starts the ranks itself."""
    monkeypatch.setenv("LSB_JOBID", "1")
    args = _HorovodArgs()
    args.num_proc = None
    args.command = ["python", "train.py"]
    with mock.patch.multiple(LSFUtils, get_compute_hosts=mock.MagicMock(return_value=["h1", "h2"]),
                             get_num_gpus=mock.MagicMock(return_value=2)), \
            mock.patch.object(launch.network, "filter_local_addresses",
                              return_value=["h1", "h2"]), \
            mock.patch.object(launch, "mpi_built", return_value=True), \
            mock.patch.object(launch, "is_jsrun_installed", return_value=jsrun), \
            mock.patch.object(launch, "_check_all_hosts_ssh_successful") as ssh_check, \
            mock.patch.object(launch.driver_service, "get_common_interfaces") as probe, \
            mock.patch.object(launch, "run_controller") as run_controller:
        launch._run(args)
    assert (args.hosts, args.num_proc) == ("h1:2,h2:2", 4)
    run_controller.assert_called_once()
    assert ssh_check.called is not jsrun
    probe.assert_not_called()


def test_function_mode_address_without_the_probe():
    """The KV store's address for function mode: on the given interface, else on the route to
    the first remote host (127.0.0.2 is routed through loopback)."""
    assert launch._address_towards(None, []) == "127.0.0.1"
    assert launch._address_towards(None, ["127.0.0.2"]) == "127.0.0.1"
    loopback = launch.network.get_loopback_intfs()[0]
    assert launch._address_towards({loopback}, ["10.255.255.1"]) == "127.0.0.1"
    with pytest.raises(RuntimeError, match="cannot resolve host no-such-host.invalid"):
        launch._address_towards(None, ["no-such-host.invalid"])


# The jsrun stand-in and jobs across the test bed's hosts.

# Reports its host, rank and CPU binding, and checks an allreduce across the hosts against numpy.
WORKER = textwrap.dedent("""
    import json, os, socket
    import numpy as np
    from horovod.common import ops
    from horovod.common.basics import HorovodBasics

    hvd = HorovodBasics()
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    x = np.linspace(-1.0, 1.0, 1001) * (rank + 1) + rank
    ops.wait(ops.allreduce_async([x], [x], ["x"], hvd.Sum))
    expected = sum(np.linspace(-1.0, 1.0, 1001) * (r + 1) + r for r in range(size))
    # One write(2) for the whole line: the bed sets PYTHONUNBUFFERED, under which print() writes
    # the text and its newline apart, and mpirun passes on each write as it comes, so two ranks
    # of one host could leave "RESULT {...}RESULT {...}" on one line.
    os.write(1, ("RESULT " + json.dumps({
        "rank": rank, "size": size, "local_rank": hvd.local_rank(),
        "hostname": socket.gethostname(), "cpus": sorted(os.sched_getaffinity(0)),
        "controller": os.environ.get("HOROVOD_CONTROLLER"),
        "max_error": float(np.max(np.abs(x - expected)))}) + "\\n").encode())
    hvd.shutdown()
""")


@pytest.fixture
def bed(testbed):
    return testbed


@pytest.fixture
def worker(tmp_path):
    path = tmp_path / "worker.py"
    path.write_text(WORKER)
    return str(path)


def _lsf_env(bed, tmp_path, mcpu_hosts):
    env = bed.env()
    for name in LSF_VARIABLES:
        env.pop(name, None)
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    env.update(LSB_JOBID="4242", LSB_MCPU_HOSTS=mcpu_hosts, TMPDIR=str(tmp),
               PATH="%s:%s" % (STANDIN_DIR, env["PATH"]))
    return env


def _results(stdout):
    return {r["rank"]: r for r in (json.loads(line[len("RESULT "):])
                                   for line in stdout.splitlines() if line.startswith("RESULT "))}


def _erf_placement(erf_text):
    return {int(m.group(1)): (m.group(2), int(m.group(3)), int(m.group(4))) for m in re.finditer(
        r"^rank: (\d+): \{ hostname: (\S+); cpu: \{(\d+)-(\d+)\} ; gpu: \* ; mem: \* \}$",
        erf_text, re.M)}


def _check_ranks_where_placed(bed, results, placement):
    names = dict((address, name) for name, address in bed.hosts)
    assert sorted(results) == sorted(placement), results
    for rank, (host, first, last) in placement.items():
        r = results[rank]
        assert r["hostname"] == names[host], (rank, r, placement)
        assert r["size"] == len(placement) and r["controller"] == "mpi", r
        assert r["max_error"] < 1e-9, r
        # Bound to as many hardware threads as the ERF gives it, disjoint from its neighbours'.
        assert len(r["cpus"]) == last - first + 1, r
    for a in results.values():
        for b in results.values():
            if a["rank"] < b["rank"] and a["hostname"] == b["hostname"]:
                assert not set(a["cpus"]) & set(b["cpus"]), (a, b)


def test_lsf_job_defaults_to_jsrun_across_hosts(bed, tmp_path, worker):
    """LSB_JOBID set and jsrun on PATH: no -np, -H or --jsrun; hosts, slots and threads come from
    the allocation (the launch node, listed first with one slot, is left out)."""
    env = _lsf_env(bed, tmp_path, "%s 1 %s 2 %s 2" % (socket.gethostname(), bed.host(1)[1],
                                                      bed.host(2)[1]))
    run = subprocess.run([sys.executable, "-m", "horovod.runner.launch", "--verbose",
                          sys.executable, worker], env=env, capture_output=True, text=True,
                         timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    (erf,) = (tmp_path / "tmp").iterdir()
    erf_text = erf.read_text()
    assert "jsrun --erf_input %s  --smpiargs '%s' %s %s\n" % (
        erf, OMPI_FLAGS, sys.executable, worker) in run.stdout
    assert erf_text in run.stdout
    threads = lsf._query_host(socket.gethostname())[0]
    per_rank = threads  # 2 LSF slots (cores) per host, 2 ranks per host (no GPUs)
    placement = _erf_placement(erf_text)
    assert placement == {
        0: (bed.host(1)[1], 0, per_rank - 1), 1: (bed.host(1)[1], per_rank, 2 * per_rank - 1),
        2: (bed.host(2)[1], 0, per_rank - 1), 3: (bed.host(2)[1], per_rank, 2 * per_rank - 1)}
    results = _results(run.stdout)
    _check_ranks_where_placed(bed, results, placement)
    assert [results[r]["local_rank"] for r in range(4)] == [0, 1, 0, 1]


def test_standin_places_each_rank_on_its_erf_host(bed, tmp_path, worker):
    """A placement no host order would give: the check above can fail when an ERF is wrong."""
    h1, h3 = bed.host(1)[1], bed.host(3)[1]
    erf = tmp_path / "erf"
    erf.write_text("overlapping_rs: allow\ncpu_index_using: logical\n\n"
                   "rank: 0: { hostname: %s; cpu: {1-1} ; gpu: * ; mem: * }\n"
                   "rank: 1: { hostname: %s; cpu: {0-0} ; gpu: * ; mem: * }\n"
                   "rank: 2: { hostname: %s; cpu: {0-0} ; gpu: * ; mem: * }\n" % (h3, h1, h3))
    env = _lsf_env(bed, tmp_path, "%s 2 %s 2" % (h1, h3))
    env["HOROVOD_CONTROLLER"] = "mpi"
    run = subprocess.run(["jsrun", "--erf_input", str(erf), "--smpiargs", OMPI_FLAGS,
                          sys.executable, worker], env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    results = _results(run.stdout)
    _check_ranks_where_placed(bed, results, _erf_placement(erf.read_text()))
    assert (results[0]["cpus"], results[2]["cpus"]) == ([1], [0])
    assert not list((tmp_path / "tmp").iterdir())


@pytest.mark.parametrize("erf, env, status, message", [
    ("rank: 0: { hostname: h1; cpu: {0-1} ; gpu: * ; mem: * }\n"
     "rank: 1: { hostname: h1; cpu: {2-3} ; gpu: * ; mem: * }\n", {}, 2, "overlap"),
    ("overlapping_rs: allow\nrank: 0: { hostname: h9; cpu: {0-1} }\n", {}, 2,
     "not in this job's allocation"),
    ("overlapping_rs: allow\nrank: 1: { hostname: h1; cpu: {0-1} }\n", {}, 2, "0..N-1"),
    ("cpu_index_using: nearest\nrank: 0: { hostname: h1; cpu: {0-1} }\n", {}, 2, "preamble"),
    ("rank: 0: { hostname: h1; cpu: {0-1} }\n", {"LSB_JOBID": None}, 1, "not inside an LSF job"),
])
def test_standin_refuses_what_jsrun_refuses(tmp_path, erf, env, status, message):
    path = tmp_path / "erf"
    path.write_text(erf)
    run_env = dict(os.environ, LSB_JOBID="1", LSB_MCPU_HOSTS="h1 4")
    for key, value in env.items():
        run_env.pop(key) if value is None else run_env.__setitem__(key, value)
    run = subprocess.run([str(STANDIN_DIR / "jsrun"), "--erf_input", str(path), "true"],
                         env=run_env, capture_output=True, text=True, timeout=30)
    assert run.returncode == status and message in run.stderr, run.stderr


def test_function_mode_through_jsrun(bed, tmp_path, monkeypatch):
    """``_run`` with a function inside an LSF job: jsrun runs the ranks on the allocation's host,
    they fetch the function from this host's KV store (its address found by the route to that
    host) and return results by rank; the ERF is removed afterwards."""
    env = _lsf_env(bed, tmp_path, "%s 1 %s 2" % (socket.gethostname(), bed.host(3)[1]))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr("tempfile.tempdir", env["TMPDIR"])

    def where():
        import os
        import socket
        return socket.gethostname(), int(os.environ["OMPI_COMM_WORLD_RANK"])

    args = _HorovodArgs()
    args.num_proc = None
    args.run_func = where
    args.disable_cache = True
    assert launch._run(args) == [(bed.host(3)[0], 0), (bed.host(3)[0], 1)]
    assert not list((tmp_path / "tmp").iterdir())
