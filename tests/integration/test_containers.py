"""The container backend for real: podman containers, the seed's flow, isolation, bad input, restarts.

Skips (with the reason) where podman cannot run containers. The image is built once per session and
cached by its inputs (`elastrain image build`).
"""

from __future__ import annotations

import json
import time

import pytest

from elastrain.backends.podmanctl import podman
from elastrain.client import ClientError
from elastrain.report import build_report
from elastrain.testing.clusters import all_running, job_world, run_in
from elastrain.testing.containers import ContainerPlane, server_containers, shared_storage
from elastrain.testing.timings import record_timing
from elastrain.testing.waits import wait_until

pytestmark = pytest.mark.timeout(600)
SAMPLES = 10000
EPOCHS = 14  # of the elastic job in the seed flow


def labels_of(name: str) -> dict[str, str]:
    info = json.loads(podman("inspect", name, "--format", "json").stdout)[0]
    return dict(info["Config"]["Labels"])


def test_seed_flow_on_containers(ccp: ContainerPlane) -> None:
    """Create 2 containers, hostfile and /data inside, -np 2 trains 5,000 samples per container; an
    elastic job grows 2 -> 4 with the cluster, survives `podman kill` of a worker, exactly once; delete
    leaves nothing."""
    data = shared_storage(ccp, "seed-data")
    t0 = time.monotonic()
    made = ccp.cli(
        "cluster", "create", "seed", "--framework", "pytorch", "--containers", "2",
        "--shm", "256Mi", "--mount", f"{data}:/data", "--wait",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    record_timing(ccp, "containers: create 2 -> Running", time.monotonic() - t0)
    with ccp.client() as c:
        cluster = c.get_cluster("seed")
        assert all_running(cluster) and cluster.image.startswith("localhost/elastrain-pytorch")
        names = server_containers(ccp.key)
        assert len(names) == 2
        roles = sorted(labels_of(n)["elastrain.role"] for n in names)
        assert roles == ["launcher", "worker"]
        assert {labels_of(n)["elastrain.cluster"] for n in names} == {"seed"}

        code, out = run_in(
            c, "seed", "sh", "-c", "cat /etc/mpi/hostfile; ls /data; hostname; id -u; df -B1 /dev/shm"
        )
        assert code == 0, out
        assert "seed-launcher slots=1\nseed-worker-0 slots=1\n" in out
        assert "mnist_elastic.py" in out and "\nseed-launcher\n" in out
        assert int(out.split("seed-launcher\n")[-1].split()[0]) >= 20000  # the tenant's uid, not root
        assert str(256 * 1024 * 1024) in out  # /dev/shm is the cluster's size

        # -np 2 typed in the launcher (exec, as the terminal does): 5,000 samples per container
        run = "elastrain run -np 2 --hostfile /etc/mpi/hostfile --ledger /data/np2"
        run += " python /data/mnist_elastic.py"
        code, out = run_in(c, "seed", *run.split(), "--epochs", "1", "--batch-size", "200")
        assert code == 0, out[-3000:]
        report = build_report(data / "np2", SAMPLES)
        assert [(e["samples"], e["duplicates"], e["missing"]) for e in report["epochs"]] == [(SAMPLES, 0, 0)]
        assert report["generations"][0]["samples_per_worker"] == {
            "seed-launcher#0": 5000,
            "seed-worker-0#0": 5000,
        }

        # an elastic job submitted through the API follows scale 2 -> 4 and a killed container
        elastic = "elastrain run -v --min-np 2 --max-np 4 --hostfile /etc/mpi/hostfile --ledger /data/el"
        # long enough that a replaced container (podman run, its node daemon, torch imported) is taken
        # back before the job ends: with 8 epochs a slow machine finished training on the 3 survivors
        train = f"python /data/mnist_elastic.py --epochs {EPOCHS} --batch-size 200 --step-sleep 0.03"
        job = c.submit_job("seed", f"{elastic} {train}".split())
        world = job_world(c, job["id"])
        wait_until(world(2), 120, "the job to train with 2 workers")
        t0 = time.monotonic()
        c.scale_cluster("seed", 4)
        c.wait_cluster("seed", all_running, timeout=60)
        record_timing(ccp, "containers: scale 2 -> 4 Running", time.monotonic() - t0)
        wait_until(world(4), 120, "the job to grow to 4 workers")
        record_timing(ccp, "containers: scale 2 -> 4 -> training at 4", time.monotonic() - t0)
        podman("kill", f"elastrain-{ccp.key}-seed-worker-1")

        def survivors_went_on() -> bool:  # an incident: the 3 survivors formed a generation and stepped
            incidents = [e["detail"] for e in c.job_events(job["id"]) if e["action"] == "job.incident"]
            return any(i["cause"] == "worker_failure" and i["world_size"] == 3 for i in incidents)

        try:
            wait_until(survivors_went_on, 60, "the job to go on with the 3 survivors")
        except AssertionError as exc:
            events = [(e["action"], e["detail"]) for e in c.job_events(job["id"])]
            log = c.job_logs(job["id"])[0][-4000:]
            raise AssertionError(f"{exc}\nevents: {events}\nlog: {log}") from None
        failed = wait_until(
            lambda: [e for e in c.events("seed") if e["action"] == "container.failed"] or None,
            30,
            "the killed container to be reported",
        )
        assert "exited with code 137" in failed[0]["detail"]["reason"], failed
        wait_until(world(4), 120, "the job to take the replaced container back")
        done = wait_until(
            lambda: (j := c.get_job(job["id"]))["status"] != "Running" and j, 300, "the job to finish"
        )
        assert (done["status"], done["exit_code"]) == ("Succeeded", 0), c.job_logs(job["id"])[0][-3000:]
        report = build_report(data / "el", SAMPLES)
        assert [(e["samples"], e["duplicates"], e["missing"]) for e in report["epochs"]] == [
            (SAMPLES, 0, 0)
        ] * EPOCHS
        causes = [(g["world_size"], g["cause"]) for g in report["generations"]]
        assert causes[:4] == [(2, "start"), (4, "scale_out"), (3, "worker_failure"), (4, "scale_out")], causes
        at_four = [g["samples_per_worker"] for g in report["generations"] if g["world_size"] == 4]
        grown = max(at_four, key=lambda shares: sum(shares.values()))
        assert len(grown) == 4 and len(set(grown.values())) == 1, at_four  # 50 per worker per step
        assert report["surviving_worker_pids_unchanged"], report["worker_pids"]

        c.delete_cluster("seed")
        c.wait_deleted("seed", timeout=60)
    assert server_containers(ccp.key) == []
    nets = podman("network", "ls", "--format", "{{.Name}}")
    assert f"elastrain-{ccp.key}-seed" not in nets.stdout.split()


def test_tenants_are_isolated(ccp: ContainerPlane) -> None:
    """From a non-admin's exec: no admin token, database, other cluster, host process or network."""
    with ccp.client() as admin:
        bob = admin.create_user("bob")
        admin.create_cluster("other", framework="pytorch", containers=2)
        admin.wait_cluster("other", all_running, timeout=60)
        code, other_ip = run_in(admin, "other", "hostname", "-i")
        assert code == 0
    server_pid = ccp.proc.pid if ccp.proc else 0
    with ccp.client(bob) as c:
        c.create_cluster("mine", framework="pytorch", containers=2, gpus_per_container=1)
        c.wait_cluster("mine", all_running, timeout=60)
        data_dir = str(ccp.data)
        probes = {
            "admin token by absolute path": f"cat {data_dir}/admin-token",
            "admin token by ../ walk": "cat ../../../admin-token ../../admin-token ../admin-token",
            "the database": f"ls {data_dir}/elastrain.db",
            "other cluster's files": f"ls {data_dir}/clusters/other",
            "the server's process": f"cat /proc/{server_pid}/cmdline | grep -a elastrain",
            "other cluster by name": "getent hosts other-launcher",
            "other cluster by address": (
                f"python -c \"import socket; socket.create_connection(('{other_ip.strip()}', 29600), 3)\""
            ),
            "host's root": "ls /root /work",
        }
        for what, probe in probes.items():
            code, out = run_in(c, "mine", "sh", "-c", probe)
            assert code != 0, f"{what} reachable: {out}"
        code, out = run_in(
            c, "mine", "sh", "-c", "grep -a -l 'elastrain[ ]server' /proc/[0-9]*/cmdline; echo ok"
        )
        assert out.strip() == "ok", f"server process visible: {out}"
        code, out = run_in(c, "mine", "sh", "-c", "id -u; grep CapEff /proc/self/status")
        assert code == 0 and int(out.split()[0]) >= 20000 and out.split()[-1] == "0000000000000000", out
        # GPUs: the container sees its own device node only, as CUDA device 0
        cluster = c.get_cluster("mine")
        gpus = sorted(g for k in cluster.containers for g in k.gpu_ids)
        assert len(gpus) == 2 and len(set(gpus)) == 2
        for k in cluster.containers:
            probe = "ls /dev | grep nvidia; echo cuda=$CUDA_VISIBLE_DEVICES"
            code, out = run_in(c, "mine", "sh", "-c", probe, container=k.name)
            assert out.split() == [f"nvidia{k.gpu_ids[0]}", "cuda=0"], (k.name, out)
        with pytest.raises(ClientError) as refused, ccp.client() as admin:
            next(iter(admin.exec("mine", ["true"])))
        assert refused.value.status == 403
        c.delete_cluster("mine")
        c.wait_deleted("mine", timeout=60)
    with ccp.client() as admin:
        admin.delete_cluster("other")
        admin.wait_deleted("other", timeout=60)


def test_bad_input_is_refused_and_nothing_is_created(ccp: ContainerPlane) -> None:
    cases = [
        ({"image": "no-such-image"}, "unknown image"),
        ({"image": "elastrain-pytorch", "framework": "deepspeed"}, "not deepspeed"),
        ({"mounts": ["/etc:/data"]}, "outside the allowed roots"),
        ({"mounts": [f"{ccp.mounts}:data"]}, "must be an absolute path"),
        ({"gpus_per_container": 5}, "GPUs"),
        ({"shm": "2Gi", "memory": "1Gi"}, "larger than the memory limit"),
    ]
    with ccp.client() as c:
        for extra, message in cases:
            body = {"framework": "pytorch", "containers": 2, **extra}
            with pytest.raises(ClientError) as refused:
                c.create_cluster("bad", **body)  # type: ignore[arg-type]
            assert 400 <= refused.value.status < 500 and message in str(refused.value), (extra, refused.value)
        assert [k.name for k in c.list_clusters()] == []
    assert server_containers(ccp.key) == []
    # (a framework no image holds: tests/unit/test_images.py; which images exist depends on the machine)
    out = ccp.cli("cluster", "create", "bad", "--framework", "pytorch", "--image", "no-such-image")
    assert out.returncode != 0 and "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_restart_adopts_and_an_exited_container_is_failed(ccp: ContainerPlane) -> None:
    with ccp.client() as c:
        c.create_cluster(
            "keep", framework="pytorch", containers=2, restart_policy="Never", memory="1Gi", cpus=1
        )
        c.wait_cluster("keep", all_running, timeout=60)
    before = sorted(server_containers(ccp.key))
    info = json.loads(podman("inspect", before[0], "--format", "json").stdout)[0]
    assert info["HostConfig"]["Memory"] == 1024**3 and info["HostConfig"]["NanoCpus"] == 10**9
    ids = {n: json.loads(podman("inspect", n, "--format", "json").stdout)[0]["Id"] for n in before}
    ccp.kill()
    ccp.start()
    with ccp.client() as c:
        c.wait_cluster("keep", all_running, timeout=60)
        after = {n: json.loads(podman("inspect", n, "--format", "json").stdout)[0]["Id"] for n in before}
        assert after == ids and sorted(server_containers(ccp.key)) == before  # adopted, no duplicates
        podman("kill", f"elastrain-{ccp.key}-keep-worker-0")
        worker = wait_until(
            lambda: next(
                (k for k in c.get_cluster("keep").containers if k.role == "worker" and k.state == "Failed"),
                None,
            ),
            30,
            "the exited container to be Failed",
        )
        assert "exited with code 137" in worker.reason and "last lines:" in worker.reason, worker.reason
        c.delete_cluster("keep")
        c.wait_deleted("keep", timeout=60)
    assert server_containers(ccp.key) == []
