"""The MPIJob manifests of docs/kubernetes.md, checked against the field names and values of the
Kubeflow MPI Operator's kubeflow.org/v2beta1 API (no cluster here: the schema below is written
from the API's reference, the MPIJob, MPIJobSpec, RunPolicy, SchedulingPolicy and ReplicaSpec
types, and the Kubernetes PodTemplateSpec fields the manifests use), and against what horovodrun
accepts: each launcher's horovodrun arguments parse, and their -np fits the workers' slots."""

import pathlib
import re

import pytest
import yaml

from horovod.runner import launch

DOC = pathlib.Path(__file__).resolve().parents[3] / "docs" / "kubernetes.md"

# A schema is a dict {field: sub-schema}, a set of allowed values, a type, or ANY.
ANY = object()
QUANTITY = (int, str)

CONTAINER = {
    "name": str, "image": str, "imagePullPolicy": {"Always", "IfNotPresent", "Never"},
    "command": [str], "args": [str], "workingDir": str,
    "env": [{"name": str, "value": str, "valueFrom": ANY}],
    "resources": {"limits": {str: QUANTITY}, "requests": {str: QUANTITY}},
    "securityContext": {"runAsUser": int, "runAsGroup": int, "runAsNonRoot": bool, "privileged": bool,
                        "capabilities": ANY},
    "volumeMounts": [{"name": str, "mountPath": str, "readOnly": bool, "subPath": str}],
    "ports": [{"name": str, "containerPort": int, "protocol": str}],
}
POD_TEMPLATE = {
    "metadata": {"labels": {str: str}, "annotations": {str: str}},
    "spec": {"containers": [CONTAINER], "initContainers": [CONTAINER], "volumes": ANY,
             "nodeSelector": {str: str}, "tolerations": ANY, "affinity": ANY,
             "serviceAccountName": str, "hostNetwork": bool, "priorityClassName": str},
}
REPLICA_SPEC = {"replicas": int, "template": POD_TEMPLATE,
                "restartPolicy": {"Always", "OnFailure", "Never", "ExitCode"}}
RUN_POLICY = {
    "cleanPodPolicy": {"All", "Running", "None"}, "ttlSecondsAfterFinished": int,
    "activeDeadlineSeconds": int, "backoffLimit": int, "suspend": bool, "managedBy": str,
    "schedulingPolicy": {"minAvailable": int, "queue": str, "minResources": {str: QUANTITY},
                         "priorityClass": str, "scheduleTimeoutSeconds": int},
}
MPIJOB = {
    "apiVersion": {"kubeflow.org/v2beta1"}, "kind": {"MPIJob"},
    "metadata": {"name": str, "namespace": str, "labels": {str: str}, "annotations": {str: str}},
    "spec": {
        "slotsPerWorker": int, "runPolicy": RUN_POLICY, "sshAuthMountPath": str,
        "mpiImplementation": {"OpenMPI", "Intel", "MPICH"},
        "launcherCreationPolicy": {"AtStartup", "WaitForWorkersReady"}, "runLauncherAsWorker": bool,
        "mpiReplicaSpecs": {"Launcher": REPLICA_SPEC, "Worker": REPLICA_SPEC},
    },
}
REQUIRED = [("spec", "mpiReplicaSpecs", "Launcher", "template", "spec", "containers"),
            ("spec", "mpiReplicaSpecs", "Worker", "template", "spec", "containers")]


def check(value, schema, path="MPIJob"):
    """Errors (list of str) of ``value`` against ``schema``."""
    if schema is ANY:
        return []
    if isinstance(schema, set):
        return [] if value in schema else ["%s: %r is not one of %s" % (path, value, sorted(schema))]
    if isinstance(schema, (type, tuple)):
        ok = isinstance(value, schema) and not (schema is int and isinstance(value, bool))
        return [] if ok else ["%s: %r is not %s" % (path, value, schema)]
    if isinstance(schema, list):
        if not isinstance(value, list):
            return ["%s: %r is not a list" % (path, value)]
        return [e for i, item in enumerate(value) for e in check(item, schema[0], "%s[%d]" % (path, i))]
    if not isinstance(value, dict):
        return ["%s: %r is not a mapping" % (path, value)]
    errors = []
    for key, item in value.items():
        if str in schema:  # a map of free keys
            errors += check(key, str, path) + check(item, schema[str], "%s.%s" % (path, key))
        elif key not in schema:
            errors.append("%s: unknown field %r (the API has %s)" % (path, key, sorted(schema)))
        else:
            errors += check(item, schema[key], "%s.%s" % (path, key))
    return errors


def manifests():
    blocks = re.findall(r"^```yaml\n(.*?)^```", DOC.read_text(), flags=re.M | re.S)
    return [yaml.safe_load(block) for block in blocks]


def test_the_page_has_the_three_manifests():
    assert [m["metadata"]["name"] for m in manifests()] == ["digits", "resnet", "elastic-digits"]


@pytest.mark.parametrize("index", range(3))
def test_manifest_uses_only_v2beta1_fields(index):
    manifest = manifests()[index]
    assert check(manifest, MPIJOB) == []
    for path in REQUIRED:
        node = manifest
        for key in path:
            assert key in node, "%s is missing %s" % (manifest["metadata"]["name"], ".".join(path))
            node = node[key]


def test_the_checker_finds_wrong_fields():
    # The schema check itself: misspelled, misplaced and mistyped fields are found.
    manifest = manifests()[0]
    manifest["spec"]["slotsPerWroker"] = 2
    manifest["spec"]["runPolicy"]["cleanPodPolicy"] = "Sometimes"
    manifest["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] = "2"
    manifest["spec"]["mpiReplicaSpecs"]["Chief"] = {}
    errors = check(manifest, MPIJOB)
    assert len(errors) == 4, errors
    assert any("slotsPerWroker" in e for e in errors) and any("Sometimes" in e for e in errors)


@pytest.mark.parametrize("index", range(3))
def test_launcher_arguments_are_horovodruns(index):
    manifest = manifests()[index]
    spec = manifest["spec"]
    launcher = spec["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    assert launcher["command"] == ["horovodrun"]
    args = launch.parse_args(launcher["args"])
    slots = spec["slotsPerWorker"] * spec["mpiReplicaSpecs"]["Worker"]["replicas"]
    assert args.num_proc <= slots
    assert args.max_num_proc is None or args.max_num_proc <= slots
    if args.host_discovery_script:
        assert args.host_discovery_script == "/etc/mpi/discover_hosts.sh"
        assert args.slots == spec["slotsPerWorker"]
    assert args.ssh_port == 2222 and not args.hosts and not args.hostfile
