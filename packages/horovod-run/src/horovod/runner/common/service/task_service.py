"""The task side of the launcher's services: one service per host that the driver and the previous
host's task can reach (see :mod:`horovod.runner.common.service.driver_service`), and that runs
one command on a client's behalf.

A command runs through :func:`safe_shell_exec.execute` in its own process group. Its captured
output goes into a :class:`Pipe` per stream; a client's stream request is answered with
:class:`network.AckStreamResponse`, after which the service copies the pipe, UTF-8 encoded,
onto the connection until the command has ended (see ``BasicService._stream``).
"""

import codecs
import sys
import threading
import uuid

from horovod.runner.common.util import network, safe_shell_exec
from horovod.runner.util.streams import Pipe

# The shortest period, in seconds, at which a waiting exit-code request checks the command.
WAIT_FOR_COMMAND_MIN_DELAY = 0.1
# Exit code of a command whose program could not be started (the shell's "command not found").
_NOT_STARTED_EXIT_CODE = 127
# Seconds that shutdown() waits for stream requests to end once the command has ended.
_STREAMS_DRAIN_TIMEOUT_S = 10.0


class RunCommandRequest:
    """Run ``command`` with ``env`` laid over the service's ``command_env``."""

    def __init__(self, command, env, capture_stdout=False, capture_stderr=False,
                 prefix_output_with_timestamp=False):
        self.command = command
        self.env = env
        self.capture_stdout = capture_stdout
        self.capture_stderr = capture_stderr
        self.prefix_output_with_timestamp = prefix_output_with_timestamp
        # A client retries a request whose answer was lost; the id tells that retry apart from
        # a second command.
        self.request_id = uuid.uuid4().hex


class StreamCommandOutputRequest:
    """Stream one captured output of the command to the client, until the command ends."""


class StreamCommandStdOutRequest(StreamCommandOutputRequest):
    """Stream the command's standard output."""


class StreamCommandStdErrRequest(StreamCommandOutputRequest):
    """Stream the command's standard error."""


class CommandOutputNotCaptured(Exception):
    """The output asked for was not captured (see ``run_command``'s ``capture_*``)."""


class AbortCommandRequest:
    """Stop the running command's process group."""


class CommandExitCodeRequest:
    """Ask whether the command has ended, and its exit code."""


class CommandExitCodeResponse:
    """``terminated``: the command has ended; ``exit_code``: its exit code, None until then."""

    def __init__(self, terminated, exit_code):
        self.terminated = terminated
        self.exit_code = exit_code


class WaitForCommandExitCodeRequest:
    """Answered once the command has ended; ``delay``: seconds between checks."""

    def __init__(self, delay):
        self.delay = delay


class WaitForCommandExitCodeResponse:
    """``exit_code``: the command's exit code (None: the service shut down without one)."""

    def __init__(self, exit_code):
        self.exit_code = exit_code


class NotifyInitialRegistrationCompleteRequest:
    """Every task has registered with the driver: task-to-task probing may start."""


class RegisterCodeResultRequest:
    """Hand the task the result of a function it ran (``result``: any picklable object)."""

    def __init__(self, result):
        self.result = result


class _PipeWriter:
    """The destination ``safe_shell_exec`` relays a captured stream into.

    Once the pipe is closed, a write fails like one to a closed file (``ValueError``), on which
    the relay stops writing but still drains the command's output to its end.
    """

    def __init__(self, pipe):
        self._pipe = pipe

    def write(self, text):
        try:
            self._pipe.write(text)
        except RuntimeError as e:
            raise ValueError(str(e)) from None

    def flush(self):
        pass


class BasicTaskService(network.BasicService):
    """The service of task ``index``; it runs at most one command.

    Args:
        name: the service name (clients check it).
        index: this task's index (its host's position in the host list); it labels the
            command's output lines (``[<index>]<stdout>:``).
        key: the job secret (bytes).
        nics: interface names to publish (a set), or None for all.
        command_env: the command's environment (a dict), which a request's ``env`` is laid
            over; None: the request's ``env`` alone.
        verbose: verbosity (0-2); 2 prints each command run.

    Raises:
        NoValidAddressesFound: none of ``nics`` has an IPv4 address on this host.
    """

    def __init__(self, name, index, key, nics, command_env=None, verbose=0):
        super().__init__(name, key, nics)
        self._index = index
        self._command_env = command_env
        self._verbose = verbose
        self._registration_complete = threading.Event()
        self._fn_result = None
        # Guards everything below; notified when the command starts or ends and on shutdown.
        self._cond = threading.Condition()
        self._closing = False
        self._request_id = None
        self._command = None
        self._command_thread = None
        self._abort = threading.Event()
        self._pipes = {StreamCommandStdOutRequest: None, StreamCommandStdErrRequest: None}
        self._terminated = False
        self._exit_code = None
        self._exit_code_waiters = 0  # clients blocked in a WaitForCommandExitCodeRequest

    def _handle(self, req, client_address):
        if isinstance(req, RunCommandRequest):
            self._start_command(req)
            return network.AckResponse()
        if isinstance(req, StreamCommandOutputRequest):
            with self._cond:
                self._cond.wait_for(lambda: self._command_thread is not None or self._closing)
                if self._command_thread is None:
                    raise RuntimeError("the service shut down before a command was run")
            try:
                return self.stream_output(self._pipes.get(type(req)))
            except CommandOutputNotCaptured as e:
                return e  # raised again by the client
        if isinstance(req, AbortCommandRequest):
            with self._cond:
                if self._command_thread is not None:  # an abort is not kept for a later command
                    self._abort.set()
            return network.AckResponse()
        if isinstance(req, CommandExitCodeRequest):
            with self._cond:
                return CommandExitCodeResponse(self._terminated, self._exit_code)
        if isinstance(req, WaitForCommandExitCodeRequest):
            delay = max(req.delay, WAIT_FOR_COMMAND_MIN_DELAY)
            with self._cond:
                self._exit_code_waiters += 1
                try:
                    while not self._ended_or_never_will():
                        self._cond.wait(delay)
                finally:
                    self._exit_code_waiters -= 1
                return WaitForCommandExitCodeResponse(self._exit_code)
        if isinstance(req, NotifyInitialRegistrationCompleteRequest):
            self._registration_complete.set()
            return network.AckResponse()
        if isinstance(req, RegisterCodeResultRequest):
            self._fn_result = req.result
            return network.AckResponse()
        return super()._handle(req, client_address)

    def _ended_or_never_will(self):
        return self._terminated or (self._closing and self._command_thread is None)

    def _start_command(self, req):
        with self._cond:
            if self._request_id == req.request_id:
                return  # a retry of the request that started the command
            if self._command_thread is not None:
                raise RuntimeError(
                    "task service %d runs one command and already %s %r; %r was not run"
                    % (self._index, "ran" if self._terminated else "runs", self._command,
                       req.command))
            if self._closing:
                raise RuntimeError("task service %d is shutting down; %r was not run"
                                   % (self._index, req.command))
            env = self._command_environment(req.env)
            if self._verbose >= 2:
                print("Task service %d executes command: %s" % (self._index, req.command),
                      flush=True)
            self._request_id = req.request_id
            self._command = req.command
            self._pipes[StreamCommandStdOutRequest] = Pipe() if req.capture_stdout else None
            self._pipes[StreamCommandStdErrRequest] = Pipe() if req.capture_stderr else None
            self._command_thread = threading.Thread(
                target=self._run_command, args=(req.command, env, req.prefix_output_with_timestamp),
                name="%s command" % self._service_name, daemon=True)
            self._command_thread.start()
            self._cond.notify_all()

    def _command_environment(self, env):
        """``command_env`` with ``env`` laid over it; a None value in ``env`` removes the name.
        With neither given, the command inherits this process's environment."""
        if self._command_env is None and env is None:
            return None
        merged = dict(self._command_env or {})
        for name, value in (env or {}).items():
            if value is None:
                merged.pop(name, None)
            else:
                merged[name] = value
        return merged

    def _run_command(self, command, env, prefix_output_with_timestamp):
        stdout, stderr = (self._pipes[StreamCommandStdOutRequest],
                          self._pipes[StreamCommandStdErrRequest])
        try:
            exit_code = safe_shell_exec.execute(
                command, env=env, index=self._index, events=[self._abort],
                stdout=_PipeWriter(stdout) if stdout else None,
                stderr=_PipeWriter(stderr) if stderr else None,
                prefix_output_with_timestamp=prefix_output_with_timestamp)
        except OSError as e:
            print("task service %d could not run %r: %s" % (self._index, command, e),
                  file=sys.stderr, flush=True)
            exit_code = _NOT_STARTED_EXIT_CODE
        finally:
            # Readers get what is left in the pipes, then the end of the stream.
            for pipe in (stdout, stderr):
                if pipe is not None:
                    pipe.close()
        with self._cond:
            self._exit_code = exit_code
            self._terminated = True
            self._cond.notify_all()

    def _stream(self, req, wfile):
        pipe = self._pipes[type(req)]
        while (piece := pipe.read()) is not None:
            try:
                wfile.write(piece.encode("utf-8") if isinstance(piece, str) else piece)
                wfile.flush()
            except OSError:
                return  # the client went away; it may ask again and read on from here

    def stream_output(self, stream):
        """The answer to a request to stream ``stream`` (a :class:`Pipe` of the command).

        Returns:
            :class:`network.AckStreamResponse`, after which ``stream`` is copied to the client.

        Raises:
            CommandOutputNotCaptured: ``stream`` is None (that output was not captured).
        """
        if stream is None:
            raise CommandOutputNotCaptured(
                "the command of task service %d does not capture that output; run it with "
                "capture_stdout / capture_stderr" % self._index)
        return network.AckStreamResponse()

    def fn_result(self):
        """The result a client registered with ``register_code_result`` (None before that)."""
        return self._fn_result

    def wait_for_initial_registration(self, timeout):
        """Block until the driver says every task registered.

        Args:
            timeout: a :class:`~horovod.runner.common.util.timeout.Timeout`.

        Raises:
            TimeoutException: ``timeout`` ran out first.
        """
        while not self._registration_complete.wait(min(1.0, max(timeout.remaining(), 0.01))):
            timeout.check_time_out_for("tasks to start")

    def wait_for_command_start(self, timeout=None):
        """Block until a client has started a command.

        Args:
            timeout: a :class:`~horovod.runner.common.util.timeout.Timeout`, or None to wait
                without limit.

        Raises:
            TimeoutException: ``timeout`` ran out first.
        """
        with self._cond:
            while self._command_thread is None:
                self._cond.wait(None if timeout is None else max(timeout.remaining(), 0.01))
                if timeout is not None and self._command_thread is None:
                    timeout.check_time_out_for("command to run")

    def check_for_command_start(self, seconds):
        """Wait up to ``seconds`` (float) for a command to start; return whether one has."""
        with self._cond:
            return self._cond.wait_for(lambda: self._command_thread is not None, seconds)

    def wait_for_command_termination(self):
        """Block until the command has ended (a command not started yet is waited for too),
        or until the service shut down without one having started."""
        with self._cond:
            self._cond.wait_for(self._ended_or_never_will)

    def command_exit_code(self):
        """The command's exit code (``128 + s`` when killed by signal ``s``), None while it runs
        or before it started."""
        with self._cond:
            return self._exit_code

    def shutdown(self):
        """Stop the service and the command.

        A command still running is stopped (SIGTERM to its process group, SIGKILL after
        ``safe_shell_exec.GRACEFUL_TERMINATION_TIME_S`` seconds). While a client waits for its
        exit code, the command is first given the time :meth:`BasicService.shutdown` gives
        requests being answered (up to 10 s), so that the client gets the exit code of a
        command that ends by itself. Returns once the command has ended and its output streams
        have been sent.
        """
        with self._cond:
            self._closing = True
            self._cond.notify_all()  # stream requests stop waiting for a command
            if self._exit_code_waiters == 0:
                self._abort.set()
        super().shutdown()
        self._abort.set()
        with self._cond:
            thread = self._command_thread
        if thread is not None:
            thread.join()
        with self._inflight_cond:
            self._inflight_cond.wait_for(lambda: self._inflight == 0,
                                         timeout=_STREAMS_DRAIN_TIMEOUT_S)


class _OutputThread(threading.Thread):
    """Streams one captured output of the command into a text stream.

    ``exception`` holds the exception the streaming ended with (None when the command's output
    ended normally).
    """

    def __init__(self, client, req, stream):
        super().__init__(name="%s: %s" % (client._service_name, type(req).__name__),
                         daemon=True)
        self._client = client
        self._req = req
        self._stream = stream
        self.exception = None

    def run(self):
        try:
            response = self._client._send(self._req, stream=self._copy)
            if isinstance(response, CommandOutputNotCaptured):
                raise response
        except CommandOutputNotCaptured as e:
            self.exception = e
        except Exception as e:
            self.exception = e
            # Output that nobody reads would stall the command: stop it.
            try:
                self._client.abort_command()
            except Exception:  # the service is gone too; nothing left to stop
                pass

    def _copy(self, rfile):
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        flush = getattr(self._stream, "flush", None)
        while True:
            data = rfile.read1(64 * 1024)
            text = decoder.decode(data, final=not data)
            if text:
                self._stream.write(text)
                if flush is not None:
                    flush()
            if not data:
                return


class BasicTaskClient(network.BasicClient):
    """Client of a :class:`BasicTaskService`.

    Args:
        service_name: the name the service must answer with.
        task_addresses: ``{interface: [(ip, port), ...]}`` the service published.
        key: the job secret (bytes).
        verbose: print probe results when >= 2.
        match_intf: keep only addresses reached through a local interface of the same name.
        attempts: how often a request is tried on connection errors.

    Raises:
        NoValidAddressesFound: no address answered as ``service_name``.

    Every request raises ``ConnectionError`` when the service cannot be reached, and
    ``RuntimeError`` (naming the service's exception) when the service failed to carry it out.
    """

    def __init__(self, service_name, task_addresses, key, verbose, match_intf=False, attempts=3):
        super().__init__(service_name, task_addresses, key, verbose, match_intf=match_intf,
                         attempts=attempts)

    def run_command(self, command, env, capture_stdout=False, capture_stderr=False,
                    prefix_output_with_timestamp=False):
        """Start ``command`` on the task and return at once.

        Args:
            command: a string run by ``/bin/sh -c``, or a list of program arguments.
            env: a dict laid over the service's ``command_env`` (a None value removes that
                name); without a ``command_env`` it is the command's whole environment.
            capture_stdout, capture_stderr: keep that output for :meth:`stream_command_output`
                instead of printing it on the task's host.
            prefix_output_with_timestamp: put the local time before each output line.

        Raises:
            RuntimeError: the service already runs (or ran) a command, or is shutting down.
        """
        self._send(RunCommandRequest(command, env, capture_stdout, capture_stderr,
                                     prefix_output_with_timestamp))

    def stream_command_output(self, stdout=None, stderr=None):
        """Copy the command's captured output into ``stdout`` and ``stderr`` in the background.

        May be called before :meth:`run_command`: the service waits for the command. Each line
        arrives as ``[<index>]<stdout>:line`` (or ``<stderr>``), as soon as it is written.

        Args:
            stdout, stderr: text streams (``write``, and ``flush`` if they have one), or None
                for an output that is not wanted.

        Returns:
            ``(stdout_thread, stderr_thread)``: threads that end when the command's output
            ends (None for a stream not asked for). A thread's ``exception`` is then None, or
            :class:`CommandOutputNotCaptured` when that output was not captured, or the error
            that broke the stream, in which case the command was aborted.
        """
        threads = []
        for req, stream in ((StreamCommandStdOutRequest(), stdout),
                            (StreamCommandStdErrRequest(), stderr)):
            thread = None
            if stream is not None:
                thread = _OutputThread(self, req, stream)
                thread.start()
            threads.append(thread)
        return tuple(threads)

    def abort_command(self):
        """Stop the running command's process group (nothing happens when none runs)."""
        self._send(AbortCommandRequest())

    def notify_initial_registration_complete(self):
        self._send(NotifyInitialRegistrationCompleteRequest())

    def command_result(self):
        """``(terminated, exit_code)``: whether the command has ended, and its exit code (None
        until it has)."""
        response = self._send(CommandExitCodeRequest())
        return response.terminated, response.exit_code

    def command_terminated(self):
        """Whether the command has ended."""
        return self.command_result()[0]

    def register_code_result(self, result):
        """Hand the service ``result`` (any picklable object), read by its ``fn_result()``."""
        self._send(RegisterCodeResultRequest(result))

    def wait_for_command_termination(self, delay=1.0):
        """Block until the command has ended or the service is gone (``delay``: seconds
        between the service's checks)."""
        self.wait_for_command_exit_code(delay)

    def wait_for_command_exit_code(self, delay=1.0):
        """Block until the command has ended and return its exit code.

        Args:
            delay: seconds between the service's checks (at least 0.1).

        Returns:
            The exit code (``128 + s`` for a command killed by signal ``s``), or None when the
            service could not be reached or shut down without a command having run.
        """
        try:
            return self._send(WaitForCommandExitCodeRequest(delay)).exit_code
        except ConnectionError:
            return None
