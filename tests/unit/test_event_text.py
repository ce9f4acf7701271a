"""Events read as sentences (issue 28 item 4): one renderer from an event's action and detail to English,
answered by the API as ``text`` next to the structured fields, and used by the CLI."""

from __future__ import annotations

from datetime import datetime, timezone

from elastrain.server.event_text import event_sentence, event_text
from elastrain.server.schemas import EventOut

AT = datetime(2026, 1, 1, tzinfo=timezone.utc)


def test_scheduler_and_scale_events_say_what_changed_and_why() -> None:
    grown = {"before": 2, "after": 4, "reason": "grown into 2 idle GPUs"}
    assert event_sentence("cluster.rescheduled", grown) == (
        "The scheduler grew it from 2 to 4 containers: grown into 2 idle GPUs."
    )
    shrunk = {"before": 4, "after": 2, "reason": "shrunk for cluster b"}
    assert event_sentence("cluster.rescheduled", shrunk) == (
        "The scheduler shrank it from 4 to 2 containers: shrunk for cluster b."
    )
    assert event_sentence("cluster.scaled", {"before": 2, "after": 1}) == "Scaled from 2 to 1 container."
    created = {"containers": 2, "framework": "pytorch", "gpus_per_container": 1, "min_containers": 2,
               "max_containers": 4, "priority": 0}  # fmt: skip
    assert event_sentence("cluster.created", created) == (
        "Created with 2 containers (pytorch), 1 GPU each, elastic between 2 and 4."
    )


def test_a_job_incident_reads_as_a_sentence_not_key_values() -> None:
    start = {"job": 7, "generation": 0, "cause": "start", "world_size": 2, "start_step": 0, "steps_lost": 0,
             "detect_s": 0.0}  # fmt: skip
    assert event_sentence("job.incident", start) == "Job #7 started with 2 workers (generation 0)."
    grew = {
        **start,
        "generation": 1,
        "cause": "scale_out",
        "world_size": 4,
        "detect_s": 0.012,
        "recover_s": 0.5,
    }
    assert event_sentence("job.incident", grew) == (
        "Job #7 grew to 4 workers (generation 1): noticed in 0.012 s, training again after 0.5 s, "
        "no step lost."
    )
    lost = {**grew, "cause": "worker_failure", "world_size": 3, "steps_lost": 1, "recover_s": None}
    assert event_sentence("job.incident", lost) == (
        "Job #7 lost a worker and goes on with 3 workers (generation 1): noticed in 0.012 s, 1 step lost."
    )


def test_unknown_or_unreadable_events_still_show_their_particulars() -> None:
    assert event_sentence("cluster.teleported", {"to": "mars"}) == "cluster.teleported to=mars"
    assert event_sentence("unknown", {"action": "cluster.teleported", "to": "mars"}) == (
        "cluster.teleported to=mars"
    )
    assert event_sentence("cluster.created", {"containers": 2}) == "Created with 2 containers (?)."


def test_the_api_answers_the_sentence_next_to_the_structured_fields() -> None:
    detail = {"job": 3, "command": ["elastrain", "run", "-np", "2"]}
    out = EventOut.stored(AT, "alice", "job.submitted", "a", detail)
    assert out.action.value == "job.submitted" and out.detail == detail
    assert out.text == "Job #3 submitted: elastrain run -np 2"
    assert event_text(out.model_dump(mode="json")) == out.text  # the CLI's view of the API's answer
    odd = EventOut.stored(AT, "server", "cluster.teleported", "a", {"to": "mars"})
    assert odd.action.value == "unknown" and odd.text == "cluster.teleported to=mars"


def test_every_event_the_control_plane_emits_reads_as_a_sentence() -> None:
    from elastrain.db.models import EventAction

    for action in (a for a in EventAction if a.value != "unknown"):  # unknown: shown as stored
        text = event_sentence(action.value, {"reason": "why", "job": 3, "container": "c-worker-0"})
        assert not text.startswith(action.value), f"{action.value} has no sentence: {text}"
