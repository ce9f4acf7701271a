"""The shipped test and demo harness, used by the tests, `elastrain chaos`, `elastrain demo` and bench/.

- `ports`: free loopback ports (`free_port`, `free_port_pair`);
- `waits`: one bounded wait (`wait_until`: a condition, a timeout, a message; `poll` answers a bool);
- `processes`: start, track and kill process trees by PID (`terminate`, `kill_all`, `Tagged` groups);
- `server`: the server driver (`ControlPlane`: an `elastrain server` on a private data dir and token,
  its clients and CLI, stopped with every cluster deleted and no container process left);
- `jobs`: the job driver and watcher (`ElasticJob`, `JobWatcher`, `LedgerRecords`);
- `faults`: faults as data (`FaultKind`, `Fault`) and the actions that inject them;
- `clusters`: conditions on clusters and jobs of a server (`all_running`, `settled`, `job_world`);
- `containers`: the container backend under test (`ContainerPlane`, fake GPUs, framework clusters);
- `postgres`: a private PostgreSQL; `app`: the API app in process; `timings`: measured latencies.

Nothing here installs anything: a missing tool is reported (`ToolMissing`, or a pytest skip).
"""
