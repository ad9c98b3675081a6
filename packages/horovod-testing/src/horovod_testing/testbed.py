"""The multi-host test bed from Python: N hosts of this machine, each a network namespace with its
own hostname and sshd (``ci/testbed.sh`` in the repository does the work; see its header).

Host K (1-based, as in the names) is ``hvd-hK`` at ``198.18.0.K``, ssh on ports 22 and 2222; the
launcher's address on the shared interface ``hvdbr0`` is ``198.18.0.254``::

    bed = Testbed()
    bed.up(3)
    subprocess.run(["ssh", "198.18.0.2", "hostname"], env=bed.env())   # prints hvd-h2
    bed.down()

Needs root; :meth:`Testbed.up` raises :class:`TestbedUnavailable` where network namespaces cannot
be made (the script's exit status 77).

Slurm mode: :meth:`Testbed.slurm_up` starts a Slurm cluster on hosts 1..N of the running bed
(slurmctld at 198.18.0.254, a slurmd per host, nodes named as the hosts with 2 CPUs each, one
munged); :meth:`Testbed.slurm_env` gives the environment in which ``srun``, ``salloc``,
``sbatch`` and ``scontrol`` use it; :meth:`Testbed.slurm_down` stops it by PID and removes its
files::

    bed.slurm_up(2)
    subprocess.run(["srun", "-N2", "hostname"], env=bed.slurm_env())   # hvd-h1, hvd-h2
    bed.slurm_down()
"""

import os
import pathlib
import signal
import subprocess
import time

__all__ = ["Testbed", "TestbedError", "TestbedUnavailable", "find_script", "UNAVAILABLE"]

UNAVAILABLE = 77  # the script's exit status for "this machine cannot do it"
DEFAULT_STATE_DIR = "/run/horovod-testbed"
SCRIPT = pathlib.Path("ci") / "testbed.sh"
INTERFACE = "hvdbr0"
LAUNCHER_ADDRESS = "198.18.0.254"
SSH_PORTS = (22, 2222)


class TestbedError(RuntimeError):
    """ci/testbed.sh failed; the message holds its error output."""

    __test__ = False  # not a test class to pytest, whatever its name


class TestbedUnavailable(TestbedError):
    """This machine cannot host the bed (not root, no network namespaces, no netem); ``reason``
    is the script's one-line explanation."""

    def __init__(self, reason):
        super().__init__(reason)
        self.reason = reason


def find_script():
    """``ci/testbed.sh`` of the repository: under ``$HOROVOD_REPO_ROOT`` if set, else in the
    current directory or one above it, else above this file (an editable install). An installed
    wheel does not ship the script, hence the search from the working directory."""
    root = os.environ.get("HOROVOD_REPO_ROOT")
    if root:
        script = pathlib.Path(root) / SCRIPT
        if not script.is_file():
            raise TestbedError(f"HOROVOD_REPO_ROOT={root} has no {SCRIPT}")
        return script
    for start in (pathlib.Path.cwd(), pathlib.Path(__file__).resolve().parent):
        for folder in (start, *start.parents):
            if (folder / SCRIPT).is_file():
                return folder / SCRIPT
    raise TestbedError(f"cannot find {SCRIPT}: run from inside the repository or set HOROVOD_REPO_ROOT")


def proc_state(pid):
    """The state letter of /proc/PID/stat (R, S, Z, ...), None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rindex(b")") + 2:].split(b" ", 1)[0].decode()


def cmdline(pid):
    """The command line of process PID, its arguments joined by spaces; "?" if there is none."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


class Testbed:
    """The bed whose state lies in ``state_dir`` (default ``$HOROVOD_TESTBED_DIR`` or
    /run/horovod-testbed). Host indices are 1-based: host 1 is ``hvd-h1``, 198.18.0.1."""

    __test__ = False
    interface = INTERFACE
    launcher_address = LAUNCHER_ADDRESS
    ssh_ports = SSH_PORTS

    def __init__(self, state_dir=None, script=None):
        self.state_dir = str(state_dir or os.environ.get("HOROVOD_TESTBED_DIR") or DEFAULT_STATE_DIR)
        self._script = pathlib.Path(script) if script else None

    # --- files of the bed ---------------------------------------------------------------------

    @property
    def script(self):
        if self._script is None:
            self._script = find_script()
        return self._script

    @property
    def key_path(self):
        """The client key authorized on every host (the agent holds it too)."""
        return os.path.join(self.state_dir, "id_ed25519")

    @property
    def unauthorized_key_path(self):
        """A key no host accepts."""
        return os.path.join(self.state_dir, "unauthorized_ed25519")

    @property
    def agent_socket(self):
        return os.path.join(self.state_dir, "agent.sock")

    @property
    def bin_dir(self):
        """Holds ``ssh``: /usr/bin/ssh with the bed's client config (known hosts in the state dir)."""
        return os.path.join(self.state_dir, "bin")

    @property
    def ssh_config(self):
        return os.path.join(self.state_dir, "ssh_config")

    @property
    def hosts(self):
        """``[(hostname, address), ...]`` of the hosts up, host 1 first; empty when down."""
        try:
            with open(os.path.join(self.state_dir, "hosts")) as f:
                return [tuple(line.split()) for line in f if line.strip()]
        except FileNotFoundError:
            return []

    def host(self, index):
        """``(hostname, address)`` of host ``index`` (1-based)."""
        hosts = self.hosts
        if not 1 <= index <= len(hosts):
            raise ValueError(f"host index {index} is not in 1..{len(hosts)} (indices are 1-based: hvd-h1 is 1)")
        return hosts[index - 1]

    # --- the script ---------------------------------------------------------------------------

    def _run(self, *args, timeout=300):
        env = dict(os.environ, HOROVOD_TESTBED_DIR=self.state_dir)
        proc = subprocess.run(["bash", str(self.script), *args], env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=timeout)
        if proc.returncode == UNAVAILABLE:
            lines = proc.stderr.strip().splitlines()
            raise TestbedUnavailable(lines[-1].removeprefix("testbed: ") if lines else "exit status 77")
        if proc.returncode != 0:
            raise TestbedError(f"ci/testbed.sh {' '.join(args)} failed (exit {proc.returncode}):\n"
                               f"{proc.stderr.strip()}")
        return proc.stdout

    def available(self):
        """``(True, "")`` if this machine can host the bed, else ``(False, reason)``."""
        try:
            self._run("check")
        except TestbedError as e:
            return False, getattr(e, "reason", str(e))
        return True, ""

    def up(self, n, netem=None):
        """Hosts 1..n (nothing to do if they are up); ``netem``: a tc netem spec for every link,
        e.g. ``"rate 10gbit delay 50us"``. Raises TestbedUnavailable or TestbedError."""
        args = ["up", str(int(n))]
        if netem:
            args += ["--netem", netem]
        self._run(*args)
        return self

    def down(self):
        """Stops every process of the bed and removes it; nothing to do when it is down."""
        self._run("down")

    # --- Slurm mode -----------------------------------------------------------------------------

    @property
    def slurm_conf(self):
        """The Slurm cluster's slurm.conf (exists while it is up)."""
        return os.path.join(self.state_dir, "slurm", "slurm.conf")

    def slurm_up(self, nodes=2):
        """A Slurm cluster on hosts 1..``nodes`` (int) of the running bed, 2 CPUs a node; nothing
        to do when it is up with that many nodes. Raises TestbedUnavailable where Slurm or munge
        is not installed, TestbedError when the bed has fewer hosts or a daemon does not start
        (the message quotes its log)."""
        self._run("slurm-up", str(int(nodes)))
        return self

    def slurm_down(self):
        """Stops slurmctld, every slurmd, munged and what jobs left on the nodes, by PID, and
        removes the cluster's files; nothing to do when it is down. Raises TestbedError."""
        self._run("slurm-down")

    def slurm_env(self, base=None):
        """``base`` (default os.environ, a mapping) with ``SLURM_CONF`` naming the bed's
        cluster, without the ``SLURM_*`` variables of any job this process may run in."""
        env = {k: v for k, v in dict(os.environ if base is None else base).items()
               if not k.startswith("SLURM_")}
        env["SLURM_CONF"] = self.slurm_conf
        return env

    def slurm_nodes(self):
        """``{node: state}`` as ``sinfo -N`` reports it (``"idle"``, ``"alloc"``, ``"down"``...);
        empty when the cluster is down."""
        try:
            proc = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], env=self.slurm_env(),
                                  capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return {}
        return dict(line.split() for line in proc.stdout.splitlines() if len(line.split()) == 2)

    def status(self):
        """The script's report: each host and whether its sshd answers on both ports."""
        env = dict(os.environ, HOROVOD_TESTBED_DIR=self.state_dir)
        proc = subprocess.run(["bash", str(self.script), "status"], env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=120)
        return proc.stdout + proc.stderr

    def shape(self, spec):
        """``tc qdisc replace ... root netem SPEC`` on both ends of every link. TestbedUnavailable
        where the kernel has no netem."""
        self._run("shape", spec)

    def unshape(self):
        self._run("unshape")

    # --- using the hosts ------------------------------------------------------------------------

    def env(self, base=None, agent=True):
        """``base`` (default os.environ) with the bed's ``ssh`` first in PATH and, with ``agent``,
        SSH_AUTH_SOCK at the bed's agent; without it, SSH_AUTH_SOCK is removed, so that only
        ``ssh -i KEY`` authenticates."""
        env = dict(os.environ if base is None else base)
        env["PATH"] = os.pathsep.join(p for p in (self.bin_dir, env.get("PATH")) if p)
        if agent:
            env["SSH_AUTH_SOCK"] = self.agent_socket
        else:
            env.pop("SSH_AUTH_SOCK", None)
        return env

    def _daemon_pids(self, name, role):
        """PIDs recorded for ``role`` on host ``name``, oldest first."""
        found = []
        try:
            with open(os.path.join(self.state_dir, "pids")) as f:
                for line in f:
                    who_role, who, pid, _start = line.split()
                    if who_role == role and who == name:
                        found.append(int(pid))
        except FileNotFoundError:
            pass
        return found

    def sshd_pid(self, index):
        """PID of host ``index``'s sshd (the listener; its sessions are its children)."""
        name, _ = self.host(index)
        # The last line of a host is its current sshd (earlier ones: sshds that were replaced).
        found = (self._daemon_pids(name, "sshd") or [None])[-1]
        if found is None:
            raise TestbedError(f"no sshd recorded for {name} in {self.state_dir}/pids: is the bed up?")
        return found

    def command(self, index, argv, cwd=None):
        """``argv`` prefixed so that it runs on host ``index`` as its ssh sessions do: in its
        network namespace, and in its sshd's UTS namespace (``hostname`` prints hvd-hK; ``ip netns
        exec`` alone would not) and mount namespace (/etc/hosts names the hosts), in ``cwd``
        (default: the current directory)."""
        name, _ = self.host(index)
        pid = self.sshd_pid(index)
        return ["nsenter", f"--net=/run/netns/{name}", f"--uts=/proc/{pid}/ns/uts", f"--mount=/proc/{pid}/ns/mnt",
                f"--wd={cwd or os.getcwd()}", "--", *argv]

    def exec(self, index, argv, **kwargs):
        """``subprocess.run`` of ``argv`` on host ``index`` (see :meth:`command`); kwargs go to
        subprocess.run."""
        return subprocess.run(self.command(index, argv, cwd=kwargs.pop("cwd", None)), **kwargs)

    def ssh(self, index, command, port=22, agent=True, key=None, **kwargs):
        """``ssh [-p PORT] [-i KEY] ADDRESS COMMAND`` from here through the bed's wrapper;
        ``subprocess.run`` kwargs (``capture_output=True, text=True``, ...) pass through."""
        _, address = self.host(index)
        argv = [os.path.join(self.bin_dir, "ssh"), "-p", str(port)]
        if key:
            argv += ["-i", str(key)]
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        return subprocess.run([*argv, address, command], env=self.env(kwargs.pop("env", None), agent=agent),
                              **kwargs)

    def pids(self, index):
        """Live processes in host ``index``'s network namespace other than its sshd and slurmd:
        what sessions and tests left behind. Zombies are left out (PID 1 may reap orphans late)."""
        name, _ = self.host(index)
        daemons = {self.sshd_pid(index), *self._daemon_pids(name, "slurmd")}
        try:
            ns = os.stat(f"/run/netns/{name}")
        except FileNotFoundError:
            return []
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) in daemons:
                continue
            try:
                st = os.stat(f"/proc/{entry}/ns/net")
            except OSError:
                continue
            if (st.st_dev, st.st_ino) == (ns.st_dev, ns.st_ino) and proc_state(entry) not in (None, "Z"):
                found.append(int(entry))
        return sorted(found)

    def leftovers(self):
        """``{hostname: ["PID command line", ...]}`` of every host with processes besides sshd."""
        left = {}
        for index, (name, _) in enumerate(self.hosts, 1):
            pids = self.pids(index)
            if pids:
                left[name] = [f"{pid} {cmdline(pid)}" for pid in pids]
        return left

    def wait_idle(self, timeout=10.0):
        """Waits until no host has processes besides its sshd (ssh sessions take a moment to end);
        returns :meth:`leftovers` at the end, empty on success."""
        deadline = time.monotonic() + timeout
        while True:
            left = self.leftovers()
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(0.1)

    def kill_leftovers(self):
        """SIGKILL to every process of :meth:`pids` on every host."""
        for index in range(1, len(self.hosts) + 1):
            for pid in self.pids(index):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
