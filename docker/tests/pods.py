"""Pods of an MPIJob, emulated on the test bed's hosts with the image built by ci/image.py.

What the Kubeflow MPI Operator (v2) gives a job, made here without Kubernetes:

- A pod is a working container of the image (`buildah from`), its root mounted (`buildah mount`)
  and entered with `chroot` by a process in the network namespace of one of the bed's hosts and in
  mount, UTS, IPC and PID namespaces of its own: the pod's hostname is its name, its /dev/shm is
  its own, and its processes die together (the namespace's PID 1 is killed) before its address
  goes, as when Kubernetes deletes a pod.
- Each pod has an address of its own, 198.18.1.K on host K's interface (the bed's hosts are
  198.18.0.K, and the bed's own sshd already listens on 198.18.0.K port 2222).
- Names: `<job>-worker-<i>.<job>-worker.<namespace>.svc` for the workers, in every pod's
  /etc/hosts (the cluster's DNS); a pod also resolves its own short name, and no other.
- The ssh key pair the operator mounts at sshAuthMountPath (/home/mpiuser/.ssh: id_rsa,
  id_rsa.pub, authorized_keys); the workers run the image's default command, horovod-sshd (port
  2222, as the image's user).
- In the launcher: /etc/mpi/hostfile (`<worker name> slots=N`), /etc/mpi/discover_hosts.sh
  (the running workers' names, one per line, without slots) and the environment the operator
  sets: OMPI_MCA_orte_default_hostfile, OMPI_MCA_orte_keep_fqdn_hostnames, OMPI_MCA_plm_rsh_args.
"""

import os
import pathlib
import shlex
import signal
import subprocess
import sys
import time

from horovod_testing.testbed import cmdline, proc_state

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "ci"))
import image  # noqa: E402  (the image's name, buildah's storage, the image's user)

POD_NET = "198.18.1"
SSH_PORT = 2222
HOME = f"/home/{image.USER}"
PATH = "/opt/horovod/bin:/usr/local/bin:/usr/bin:/bin"
START_TIMEOUT_S = 30


def buildah(*args: str) -> str:
    proc = subprocess.run([*image.BUILDAH, *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"buildah {shlex.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


def _children(pid: int) -> list[int]:
    """Every live, non-zombie descendant of ``pid``."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            with open(f"/proc/{parent}/task/{parent}/children") as f:
                kids = [int(k) for k in f.read().split()]
        except OSError:
            continue
        for kid in kids:
            if proc_state(kid) not in (None, "Z"):
                found.append(kid)
                todo.append(kid)
    return found


class Job:
    """The names and files of one MPIJob: ``workers`` worker pods of ``slots`` slots."""

    def __init__(self, name: str, namespace: str, workers: int, slots: int, keys: pathlib.Path):
        self.name, self.namespace, self.workers, self.slots = name, namespace, workers, slots
        self.keys = keys  # id_rsa, id_rsa.pub, authorized_keys
        self.running: set[int] = set()  # indices of the worker pods that run

    def worker_name(self, index: int) -> str:
        return f"{self.name}-worker-{index}"

    def worker_fqdn(self, index: int) -> str:
        return f"{self.worker_name(index)}.{self.name}-worker.{self.namespace}.svc"

    def worker_address(self, index: int) -> str:
        return f"{POD_NET}.{index + 1}"

    def hosts_file(self, own_name: str, own_address: str) -> str:
        lines = ["127.0.0.1 localhost", f"{own_address} {own_name}"]
        lines += [f"{self.worker_address(i)} {self.worker_fqdn(i)}" for i in range(self.workers)]
        return "\n".join(lines) + "\n"

    def hostfile(self) -> str:
        """The operator's /etc/mpi/hostfile in Open MPI's form (``<name> slots=N``)."""
        return "".join(f"{self.worker_fqdn(i)} slots={self.slots}\n" for i in range(self.workers))

    def discover_hosts(self) -> str:
        """The operator's discover_hosts.sh: the running workers, one name per line."""
        return "#!/bin/sh\n" + "".join(f"echo {self.worker_fqdn(i)}\n" for i in sorted(self.running))

    def launcher_env(self) -> dict[str, str]:
        return {"OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile",
                "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
                "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",
                "K_MPI_JOB_ROLE": "launcher"}


class Pod:
    """One pod: a container of the image on bed host ``host`` (1-based), at ``address``."""

    def __init__(self, bed, host: int, name: str, address: str, files: dict[str, str], label: str):
        self.bed, self.host, self.name, self.address = bed, host, name, address
        self.netns = bed.host(host)[0]
        self.proc: subprocess.Popen | None = None
        self._init: tuple[int, int] | None = None  # (PID here, inode of its PID namespace)
        self.container = buildah("from", "--name", f"{image.CONTAINER_PREFIX}{label}-{os.getpid()}", image.IMAGE)
        try:
            self.root = pathlib.Path(buildah("mount", self.container))
            for path, text in files.items():
                self.write(path, text)
            subprocess.run(["ip", "-n", self.netns, "addr", "add", f"{address}/24", "dev", bed.interface], check=True)
        except BaseException:
            self._remove_container()
            raise

    def write(self, path: str, text: str, mode: int = 0o644, owner: bool = False) -> None:
        target = self.root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        target.chmod(mode)
        if owner:
            os.chown(target, image.UID, image.UID)

    def put_keys(self, keys: pathlib.Path) -> None:
        ssh = self.root / HOME.lstrip("/") / ".ssh"
        ssh.mkdir(mode=0o700, exist_ok=True)
        os.chown(ssh, image.UID, image.UID)
        for name in ("id_rsa", "id_rsa.pub", "authorized_keys"):
            self.write(f"{HOME}/.ssh/{name}", (keys / name).read_text(), mode=0o600, owner=True)

    def start(self, argv: list[str], env: dict[str, str] | None = None, **popen) -> subprocess.Popen:
        """Starts the pod's main process ``argv`` (see :meth:`command`)."""
        self.attach(subprocess.Popen(self.command(argv, env), **popen))
        return self.proc

    def command(self, argv: list[str], env: dict[str, str] | None = None) -> list[str]:
        """The command line, to run here, that makes ``argv`` the pod's main process: run as the
        image's user with ``env`` in the pod's namespaces. Whoever starts it sets :attr:`proc`."""
        variables = {"HOME": HOME, "USER": image.USER, "LOGNAME": image.USER, "PATH": PATH, "LANG": "C.UTF-8",
                     "PYTHONUNBUFFERED": "1", **(env or {})}
        root = shlex.quote(str(self.root))
        inner = (f"hostname {shlex.quote(self.name)} && mount -t proc proc {root}/proc && "
                 f"mount --bind /dev {root}/dev && mount -t tmpfs -o size=1g,mode=1777 tmpfs {root}/dev/shm && "
                 f"exec chroot --userspec={image.UID}:{image.UID} {root} /usr/bin/env -i -C {HOME} "
                 + " ".join(shlex.quote(f"{k}={v}") for k, v in variables.items()) + " "
                 + shlex.join(argv))
        return ["nsenter", f"--net=/run/netns/{self.netns}", "--", "unshare", "--mount", "--propagation", "private",
                "--uts", "--ipc", "--pid", "--fork", "--kill-child", "--", "sh", "-c", inner]

    def attach(self, proc: subprocess.Popen) -> None:
        """Takes ``proc``, started from :meth:`command`, as the pod's: waits for its PID 1."""
        self.proc = proc
        deadline = time.monotonic() + START_TIMEOUT_S
        while self.init_pid() is None and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)

    def init_pid(self) -> int | None:
        """The PID (here) of the pod's PID 1, its main process; None before it started and once
        it ended. Remembered when first seen, since unshare, its parent, may end first."""
        if self._init is None and self.proc is not None:
            try:
                with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children") as f:
                    kids = f.read().split()
                if kids:
                    self._init = (int(kids[0]), os.stat(f"/proc/{kids[0]}/ns/pid").st_ino)
            except OSError:
                pass
        if self._init is None:
            return None
        pid, namespace = self._init
        try:
            alive = os.stat(f"/proc/{pid}/ns/pid").st_ino == namespace and proc_state(pid) != "Z"
        except OSError:
            alive = False
        return pid if alive else None

    def processes(self) -> list[str]:
        """The pod's processes besides its main one: what a job left in it."""
        init = self.init_pid()
        return [f"{pid} {cmdline(pid)}" for pid in _children(init)] if init else []

    def wait_listening(self, port: int) -> None:
        check = f"import socket; socket.create_connection(({self.address!r}, {port}), timeout=1).close()"
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"pod {self.name} ended (status {self.proc.returncode}) before listening "
                                   f"on port {port}")
            probe = subprocess.run(["nsenter", f"--net=/run/netns/{self.netns}", "--", sys.executable, "-c", check],
                                   capture_output=True)
            if probe.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"pod {self.name}: nothing listens on {self.address}:{port} after "
                                   f"{START_TIMEOUT_S} s")
            time.sleep(0.2)

    def stop(self) -> None:
        """Kills the pod's processes, all of them, and only then takes its address (on
        Kubernetes too a pod's processes die before its network goes: their connections are
        closed, not left open towards an address that vanished)."""
        init = self.init_pid()
        if init is not None:
            # SIGKILL to the PID 1 of the pod's PID namespace ends every process in it; PID 1
            # ends last. (unshare's --kill-child alone is not enough: chroot --userspec changes
            # the user, which clears the parent-death signal.)
            os.kill(init, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while self.init_pid() is not None and time.monotonic() < deadline:
                time.sleep(0.02)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc, self._init = None, None
        subprocess.run(["ip", "-n", self.netns, "addr", "del", f"{self.address}/24", "dev", self.bed.interface],
                       capture_output=True)

    def _remove_container(self) -> None:
        subprocess.run([*image.BUILDAH, "umount", self.container], capture_output=True)
        subprocess.run([*image.BUILDAH, "rm", self.container], capture_output=True)

    def delete(self) -> None:
        self.stop()
        self._remove_container()


def worker_pod(bed, job: Job, index: int) -> Pod:
    """Worker ``index`` of ``job`` on bed host index + 1, its sshd (the image's default command)
    listening on port 2222 of its address."""
    name, address = job.worker_name(index), job.worker_address(index)
    pod = Pod(bed, index + 1, name, address, {"/etc/hosts": job.hosts_file(name, address),
                                              "/etc/hostname": name + "\n"}, label=name)
    try:
        pod.put_keys(job.keys)
        # On Kubernetes sshd listens on every address of the pod; here the host's own address has
        # the bed's sshd on that port, so the pod's listens on the pod's address only.
        pod.start(["horovod-sshd", "-o", f"ListenAddress={address}"], stdout=subprocess.DEVNULL,
                  stderr=subprocess.PIPE)
        pod.wait_listening(SSH_PORT)
    except BaseException:
        pod.delete()
        raise
    job.running.add(index)
    return pod


def launcher_pod(bed, job: Job, host: int, files: dict[str, str]) -> Pod:
    name = f"{job.name}-launcher"
    address = f"{POD_NET}.{100 + host}"
    pod = Pod(bed, host, name, address, {"/etc/hosts": job.hosts_file(name, address), "/etc/hostname": name + "\n",
                                         "/etc/mpi/hostfile": job.hostfile(), **files}, label=name)
    try:
        pod.write("/etc/mpi/discover_hosts.sh", job.discover_hosts(), mode=0o755)
        pod.put_keys(job.keys)
    except BaseException:
        pod.delete()
        raise
    return pod
