# elastrain: `make demo` and `make test` work on a fresh machine (they install first).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
PYTEST := $(PY) -m pytest -q -p no:cacheprovider

# The two lanes of `make test`. The fast lane (`make test-fast`, first) runs FAST_TESTS minus the tests
# marked with one of LANE2_MARKS: those need something `make test` installs after the fast lane
# (PostgreSQL, chromium, Slurm, a GPU) or run for minutes (`slow`: multi-process runs, schemathesis
# against a live server). The second lane runs everything else, once: every other directory of tests/
# (whose fixtures also build the images), then the LANE2_MARKS tests of FAST_TESTS. A test in FAST_TESTS
# that needs podman, Slurm, chromium, PostgreSQL or a GPU must carry one of these markers, or it skips in
# the fast lane and never runs in the second.
FAST_TESTS  := tests/unit tests/contract
# tests/k8s and the -m k8s cases are opt-in (`make test-k8s`: a private Kubernetes control plane from
# `make k8s-deps`): kept out of the fast lane (LANE2_MARKS) and of the second lane (LANE2_RUN)
LANE2_RUN   := slow or postgres or browser or slurm or gpu
LANE2_MARKS := $(LANE2_RUN) or k8s
REST_TESTS  := $(filter-out $(FAST_TESTS) tests/k8s tests/__pycache__,$(patsubst %/,%,$(wildcard tests/*/))) \
               $(wildcard tests/test_*.py)

.PHONY: install demo demo-cluster demo-portal test lint unit integration bench soak soak-platform clean portal-deps slurm-deps container-deps postgres-deps image test-fast test-fast-bare audit openapi fuzz bench-scheduler bench-platform k8s-deps test-k8s

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -c constraints.txt -e '.[examples,dev,server,deepspeed,megatron,tensorboard,notebook,kubernetes]'
	touch $(STAMP)

demo: install
	$(VENV)/bin/elastrain demo --json artifacts/demo.json

demo-cluster: install container-deps
	$(VENV)/bin/elastrain demo --cluster --json artifacts/demo-cluster.json

demo-portal: install
	scripts/demo_portal.sh

# the container backend (the default) runs Debian's podman with runc; images are built with mmdebstrap.
# Installed as root when missing; without them the container tests skip and the server falls back to
# the process backend.
container-deps:
	@{ command -v podman && command -v runc && command -v mmdebstrap && command -v ssh-keygen && command -v iptables; } >/dev/null || { [ "$$(id -u)" = 0 ] && \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
	  podman runc mmdebstrap netavark aardvark-dns catatonit conmon fuse-overlayfs uidmap openssh-client iptables; } || \
	  echo "no podman/runc/mmdebstrap: container tests skip"

# the OCI image jobs run in (offline: Debian bookworm rootfs + torch CPU venv + elastrain; cached)
image: install container-deps
	$(VENV)/bin/elastrain image build

lint: install
	$(VENV)/bin/ruff check elastrain tests examples bench
	$(VENV)/bin/ruff format --check elastrain tests examples bench
	$(VENV)/bin/mypy elastrain
	$(VENV)/bin/lint-imports --no-cache

unit: install
	$(PY) -m pytest -q tests/unit

integration: install
	$(PY) -m pytest -q tests/integration

# the browser tests drive Debian's chromium (never a downloaded browser); they skip without it
portal-deps: install
	@test -x /usr/bin/chromium || { [ "$$(id -u)" = 0 ] && apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; } || echo "no chromium: browser tests skip"

# the slurm tests start a private cluster from Debian's slurm-wlm and munge; they skip without them
slurm-deps:
	@command -v slurmctld >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slurm-wlm munge; } || \
	  echo "no slurm-wlm/munge: slurm tests skip"

# the PostgreSQL legs (-m postgres) start a private server from Debian's postgresql (elastrain.testing.postgres,
# which installs nothing itself); they skip without it
postgres-deps:
	@{ command -v initdb || ls /usr/lib/postgresql/*/bin/initdb; } >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql; } || \
	  echo "no postgresql: postgres tests skip"

# the Kubernetes tests (tests/k8s, `make test-k8s`) start a private control plane (elastrain.testing.k8s)
# from kube-apiserver, kube-scheduler, kube-controller-manager and kubelet built from Debian's
# `kubernetes` source package (1.20, ~7 min on 2 cores, once) into a cache outside the repository
# (/var/cache/elastrain/k8s as root; reused when present), and Debian's etcd-server; they skip without them
k8s-deps:
	@scripts/k8s_build.sh >/dev/null || echo "no Kubernetes build: k8s tests skip"

# opt-in (not in `make test`): the Kubernetes backend against a real API server (tests/k8s), and the
# backend contract's kubernetes cases
test-k8s: install k8s-deps
	$(PYTEST) -rs -m k8s tests/k8s tests/contract/test_backend_contract.py

# the fast lane (budget: 3 minutes on a quiet 2-core machine): lint, types, import layers, unit and contract tests
test-fast: lint
	$(PYTEST) -m "not ($(LANE2_MARKS))" $(FAST_TESTS)

# the fast lane again, in a bare Debian bookworm + python3 + make container (scripts/fast_lane_bare.sh;
# its rootfs from mmdebstrap, cached): proves it needs nothing outside its venv. Skips, saying why,
# without podman or mmdebstrap (make container-deps installs them as root)
test-fast-bare: install container-deps
	@PY=$(PY) scripts/fast_lane_bare.sh; rc=$$?; if [ $$rc = 77 ]; then \
	  echo "test-fast-bare: skipped (no podman/mmdebstrap that can run here; make container-deps as root)"; \
	  else exit $$rc; fi

# known vulnerabilities in the installed dependencies (pip-audit; elastrain itself is skipped). Offline it
# prints `pip-audit: skipped (advisory database unreachable: ...)`; tolerated IDs: .ci/pip-audit-ignore.txt
audit: install
	$(PY) scripts/audit_deps.py

# the fast lane first (a failure there stops `make test` within minutes), then the second lane
# (scripts/test_lane2.sh: balanced shares of it run at once, then the load-sensitive `serial` tests alone;
# LANE2_SHARDS=1 runs it in one process); any failure in it fails `make test`. Two shares took the lane
# from ~32 to ~21 min here with no failure on a quiet machine (on one at load 8-10 some waits ran out)
LANE2_SHARDS ?= 2
test: test-fast audit portal-deps slurm-deps container-deps test-fast-bare postgres-deps
	LANE2_SHARDS=$(LANE2_SHARDS) PYTEST="$(PYTEST)" ELASTRAIN="$(VENV)/bin/elastrain" REST_TESTS="$(REST_TESTS)" FAST_TESTS="$(FAST_TESTS)" LANE2_RUN="$(LANE2_RUN)" \
	  scripts/test_lane2.sh

# 50 random faults (seeded: SEED=N reproduces a schedule) in one long run of the example; not in `make test`
SEED ?= $(shell date +%s)
soak: install
	$(VENV)/bin/elastrain chaos --scenario soak --faults 50 --seed $(SEED) --json artifacts/soak.json

# 30 random platform faults (podman kill of workers and the launcher, network cuts, kill -9 of the server
# in a scale, reboots, a full data dir; seeded) on one container-backend cluster and its elastic job; the
# last line: `soak-platform: F faults, D duplicated, M missing, O orphaned`. Needs podman and root
# (make container-deps); not in `make test`
soak-platform: install container-deps
	$(VENV)/bin/elastrain chaos --platform --soak 30 --seed $(SEED) --json artifacts/soak-platform.json

# the published API schema: docs/openapi.json from the app itself (tests/contract fails when it is stale)
openapi: install
	$(PY) scripts/export_openapi.py

# schemathesis against a live server, longer than `make test`'s run (seed 7) and with a random seed:
# the seed is printed first; SEED=N reproduces a run, FUZZ_EXAMPLES sets the examples per operation
FUZZ_EXAMPLES ?= 150
fuzz: install
	@seed=$(SEED); echo "fuzz seed: $$seed (make fuzz SEED=$$seed reproduces it)"; \
	  ELASTRAIN_FUZZ_SEED=$$seed ELASTRAIN_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) \
	  $(PYTEST) -rxXs tests/contract/test_schemathesis.py; \
	  status=$$?; echo "fuzz seed: $$seed"; exit $$status

bench: install
	$(PY) bench/vs_torchrun.py --json artifacts/bench.json

# scheduler policies on the Philly trace windows (simulated; prints avg/p99 JCT per policy and GPU count)
bench-scheduler: install
	$(PY) bench/scheduler.py --jobs 2

# a slice of the Philly trace through a real server (process backend, virtual GPUs) as real elastrain run
# jobs, --scheduler static then the default (elastic), and the simulator on the same slice; 16-19 min on 2
# busy cores; the last line is `platform: jct_ratio=R idle_ratio=I sim_jct_ratio=S` (bench/README.md)
bench-platform: install
	$(PY) bench/platform_bench.py --json artifacts/bench-platform.json

clean:
	rm -rf $(VENV) artifacts build *.egg-info
