"""Reading a question: exact names by rules, never invented."""

from __future__ import annotations

from agents.intent import Intent, IntentKind, intent_schema, match_model, parse_rules

MODELS = ["smollm2-135m-instruct", "minilm-l6-v2", "ppocr-v4", "echo"]


def _read(question: str) -> Intent:
    intent = parse_rules(question, MODELS)
    assert intent is not None, question
    return intent


def test_what_happened_names_the_model_and_the_window() -> None:
    i = parse_rules("What happened to smollm2-135m-instruct in the last 15 minutes?", MODELS)
    assert i is not None
    assert (i.kind, i.model, i.minutes) == (IntentKind.INVESTIGATE, "smollm2-135m-instruct", 15)


def test_a_model_is_found_by_a_distinctive_part_or_by_what_it_does() -> None:
    assert match_model("why is smollm2 slow?", MODELS) == "smollm2-135m-instruct"
    assert match_model("what's wrong with the embeddings model?", MODELS) == "minilm-l6-v2"
    assert match_model("is the OCR model ok", MODELS) == "ppocr-v4"
    assert match_model("what about gpt-4?", MODELS) is None


def test_windows_in_hours_and_days() -> None:
    assert _read("errors on echo in the past 2 hours").minutes == 120
    assert _read("anything wrong in the last day?").minutes == 1440


def test_lists_incident_ids_and_imperatives() -> None:
    assert _read("any incidents in the last 30 minutes?").kind is IntentKind.LIST_INCIDENTS
    i = parse_rules("explain inc-0123456789ab please", MODELS)
    assert i is not None and (i.kind, i.incident_id) == (IntentKind.DESCRIBE_INCIDENT,
                                                         "inc-0123456789ab")
    i = parse_rules("roll back echo v2", MODELS)
    assert i is not None and (i.kind, i.action, i.model, i.version) == (
        IntentKind.PROPOSE_ACTION, "rollback", "echo", "v2")


def test_an_unrecognised_question_is_left_to_the_constrained_llm() -> None:
    assert parse_rules("hello there", MODELS) is None
    schema = intent_schema(MODELS)
    assert schema["properties"]["model"]["enum"] == [*MODELS, "none"]


def test_shedding_load_is_an_action_too() -> None:
    i = _read("shed batch load on echo")
    assert (i.kind, i.action, i.model) == (IntentKind.PROPOSE_ACTION, "shed_load", "echo")


def test_approving_or_denying_names_the_action() -> None:
    i = _read("approve act-0123456789ab")
    assert (i.kind, i.action_id, i.approve) == (IntentKind.DECIDE_ACTION, "act-0123456789ab",
                                                True)
    assert _read("deny act-0123456789ab please").approve is False
