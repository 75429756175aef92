"""Multi-turn prompt_agent against real agents: a replay (or anthropic) agent as the user."""

from __future__ import annotations

import json

import pytest
from fakes.messages_api import text_reply

from agentenv_dagster.context import TaskStepContext
from agentenv_dagster.errors import TaskLoadError
from agentenv_dagster.runtime.artifacts import ObjectStore
from agentenv_dagster.steps.conversation import user_endpoint
from agentenv_dagster.steps.execution import StepFailed
from projects import leaked_servers, make_project, run_steps

AGENTS = """
[agents.registry.coder]
kind = "replay"
episodes = [
  {match = "^Write a", reply = "wrote a", actions = [{write_file = "a.txt", content = "A"}]},
  {match = "^Now b", reply = "wrote b", actions = [{write_file = "b.txt", content = "B"}]},
  {match = "^Now c", reply = "wrote c"},
]

[agents.registry.user]
kind = "replay"
episodes = [
  {match = "wrote a", reply = '{"message": "Now b please", "done": false, "mood": "fine"}'},
  {match = "wrote b", reply = {message = "Thanks, that is all.", done = true}},
]

[agents.registry.chatty-user]
kind = "replay"
episodes = [
  {match = "wrote a", reply = "Now b, plain text"},
  {match = "wrote b", reply = "Now c <<<END>>>"},
  {match = "wrote c", reply = "Now c again"},
  {match = "Start the conversation", reply = "Write a file"},
]

[agents.registry.broken-user]
kind = "replay"
episodes = [{match = "nothing matches this", reply = "x"}]
"""


@pytest.fixture
def project(tmp_path):
    root = make_project(tmp_path / "p", extra_config=AGENTS)
    yield root
    assert leaked_servers(root / ".agentenv" / "state") == []


def deploy(name: str, agent_id: str) -> dict:
    return {"id": f"deploy-{name}", "type": "deploy_agent", "a2a_agent_id": agent_id, "agent_name": name,
            "depends_on": []}


def prompt(**fields) -> dict:
    return {"id": "talk", "type": "prompt_agent", "agent_name": "coder", "prompt_id": "p",
            "depends_on": ["deploy-coder", "deploy-user"], **fields}


def conversation(project, user_agent: str, **fields):
    return run_steps(project, [deploy("coder", "coder"), deploy("user", user_agent), prompt(**fields)])


def test_the_user_agent_answers_until_it_is_done(project):
    context = conversation(project, "user", prompt="Write a file", max_conversation_turns=5, user_agent_name="user")
    response = context.find_prompt_response("p")
    turns = response.model_extra["turns"]
    assert [(t["turn"], t["user_message"], t["response"]) for t in turns] == [
        (1, "Write a file", "wrote a"), (2, "Now b please", "wrote b")]
    assert response.response == "wrote b" and response.prompt_text == "Write a file"
    assert response.model_extra["stop_reason"] == "done"
    assert response.model_extra["closing_user_message"]["message"] == "Thanks, that is all."
    # one A2A context for every agent turn; each turn is its own task with its own trajectory
    assert {t["a2a_context_id"] for t in turns} == {response.a2a_context_id}
    assert context.metadata["a2a_conversations"]["talk"] == response.a2a_context_id
    assert len({t["agent_session_id"] for t in turns}) == 2 and response.agent_session_id == turns[-1]["agent_session_id"]
    assert all(t["usage"] == {"input_tokens": 0, "output_tokens": 0} and t["state"] == "completed" for t in turns)
    assert turns[1]["user"]["text"].startswith('{"message": "Now b please"') and "user" not in turns[0]
    # extra fields of the user's answer go to usersim_turn_outputs
    assert context.metadata["usersim_turn_outputs"]["talk"] == [{"turn": 2, "mood": "fine"}]
    per_turn = response.model_extra["target_agent_per_turn_trajectory_object_urls"]
    assert len(per_turn) == 2 and all(per_turn)
    assert response.model_extra["source_agent_per_turn_prompt_parts"] == [None, [{"text": "Now b please"}]]
    # the whole dialog's trajectory: both turns' file writes, so graders see every turn
    events = json.loads(ObjectStore.read(response.agent_trajectory_object_url))
    assert [e["path"] for e in events if e["type"] == "file_write"] == ["a.txt", "b.txt"]


def test_max_turns_ends_the_conversation(project):
    context = conversation(project, "user", prompt="Write a file", max_conversation_turns=2,
                           user_agent_name="user", user_output_format={"type": "text"})
    response = context.find_prompt_response("p")
    assert [t["response"] for t in response.model_extra["turns"]] == ["wrote a", "wrote b"]
    # turn 2 was the last: the user was not asked again
    assert response.model_extra["stop_reason"] == "max_turns" and "closing_user_message" not in response.model_extra


def test_a_stop_token_is_stripped_and_its_message_is_the_last_turn(project):
    context = conversation(project, "chatty-user", prompt="Write a file", max_conversation_turns=8,
                           user_agent_name="user", user_stop_token="<<<END>>>")
    response = context.find_prompt_response("p")
    assert [t["user_message"] for t in response.model_extra["turns"]] == ["Write a file", "Now b, plain text", "Now c"]
    assert response.response == "wrote c" and response.model_extra["stop_reason"] == "stop_token"


def test_the_user_agent_can_open_the_conversation(project):
    context = conversation(project, "chatty-user", user_opens_conversation=True, max_conversation_turns=2,
                           user_agent_name="user")
    response = context.find_prompt_response("p")
    assert response.prompt_text is None
    assert [(t["user_message"], t["response"]) for t in response.model_extra["turns"]] == [
        ("Write a file", "wrote a"), ("Now b, plain text", "wrote b")]
    assert response.model_extra["turns"][0]["user"]["text"] == "Write a file"
    assert response.model_extra["source_agent_per_turn_prompt_parts"][0] == [{"text": "Write a file"}]


def test_max_total_tokens_counts_agent_and_user_tokens(tmp_path, fake_messages_api):
    root = make_project(tmp_path / "p", model={"api_key": "sk-test", "base_url": fake_messages_api.base_url,
                                              "default": "claude-test"},
                        extra_config='[agents.registry.live]\nkind = "anthropic"\n' + AGENTS)
    fake_messages_api.enqueue(
        text_reply("wrote a", usage=(10, 5)),                       # agent turn 1: 15 tokens
        text_reply('{"message": "Now b", "done": false}', usage=(20, 5)),  # user: 25
        text_reply("wrote b", usage=(30, 5)),                       # agent turn 2: 35 -> 75 >= 60
    )
    context = run_steps(root, [
        deploy("coder", "live"), deploy("user", "live"),
        prompt(prompt="Write a file", max_conversation_turns=5, user_agent_name="user", max_total_tokens=60,
               user_model="claude-user"),
    ])
    response = context.find_prompt_response("p")
    assert response.model_extra["stop_reason"] == "budget"
    assert response.model_extra["usage"] == {"input_tokens": 40, "output_tokens": 10}
    assert response.model_extra["user_usage"] == {"input_tokens": 20, "output_tokens": 5}
    assert [t["usage"]["input_tokens"] for t in response.model_extra["turns"]] == [10, 30]
    # the agent remembers the dialog: its second request carries the first exchange
    second = fake_messages_api.requests[2].body
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "user"]
    assert second["messages"][0]["content"] == "Write a file" and second["messages"][2]["content"] == "Now b"
    assert fake_messages_api.requests[1].body["model"] == "claude-user"  # user_model configures the user agent
    assert leaked_servers(root / ".agentenv" / "state") == []


def test_the_anthropic_agent_plays_a_user_persona(tmp_path, fake_messages_api):
    root = make_project(tmp_path / "p", model={"api_key": "sk-test", "base_url": fake_messages_api.base_url,
                                              "default": "claude-test"},
                        extra_config='[agents.registry.live]\nkind = "anthropic"\n' + AGENTS)
    fake_messages_api.enqueue(
        text_reply('```json\n{"message": "Now b", "done": false}\n```'),
        text_reply('{"message": "Great, thanks", "done": true}'),
    )
    context = run_steps(root, [
        deploy("coder", "coder"),
        {**deploy("user", "live"), "system_prompt": "You are Dana, an impatient product manager."},
        prompt(prompt="Write a file", max_conversation_turns=4, user_agent_name="user"),
    ])
    response = context.find_prompt_response("p")
    assert [t["user_message"] for t in response.model_extra["turns"]] == ["Write a file", "Now b"]
    assert response.model_extra["stop_reason"] == "done"
    first, second = (r.body for r in fake_messages_api.requests)
    assert "impatient product manager" in str(first["system"]) and "tools" not in first
    assert first["messages"] == [{"role": "user", "content": "wrote a"}]
    # the simulator sees its own earlier message as the assistant's
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "user"]
    assert second["messages"][2]["content"] == "wrote b"
    assert leaked_servers(root / ".agentenv" / "state") == []


def test_a_failing_user_agent_ends_the_conversation_without_failing_the_step(project):
    context = conversation(project, "broken-user", prompt="Write a file", max_conversation_turns=3,
                           user_agent_name="user")
    response = context.find_prompt_response("p")
    assert [t["response"] for t in response.model_extra["turns"]] == ["wrote a"]
    assert response.model_extra["stop_reason"] == "error" and response.error_type is None
    assert response.model_extra["stop_detail"] == (
        "user agent task failed (NoScriptedReply): no replay episode matches the prompt 'wrote a'")


def test_a_failing_agent_turn_fails_the_step_with_every_turn_recorded(project):
    project_config = project / ".agentenv" / "config.toml"
    project_config.write_text(project_config.read_text().replace('reply = "Now b, plain text"', 'reply = "unscripted"'))
    context = run_steps(project, [
        deploy("coder", "coder"), deploy("user", "chatty-user"),
        prompt(prompt="Write a file", max_conversation_turns=3, user_agent_name="user", fail_task_on_error=False),
    ])
    response = context.find_prompt_response("p")
    assert [t["state"] for t in response.model_extra["turns"]] == ["completed", "failed"]
    assert response.error_type == "NoScriptedReply" and response.model_extra["stop_reason"] == "error"
    (failure,) = context.metadata["failed_steps"]
    assert failure["error"].startswith("A2A task failed (error_type=NoScriptedReply, task_id=")


def test_a_conversation_needs_its_user_agent(project, monkeypatch):
    monkeypatch.delenv("AGENT_ENV_HUMAN_A2A_URL", raising=False)
    with pytest.raises(TaskLoadError, match=r"step 'talk': field 'user_agent_name': no step it depends on deploys "
                                            r"agent 'someone'"):
        run_steps(project, [deploy("coder", "coder"), {**prompt(prompt="hi", max_conversation_turns=2,
                                                                user_agent_name="someone"), "depends_on": ["deploy-coder"]}])
    # left at its default, the user may be the configured human: no human configured says so at run time
    with pytest.raises(StepFailed, match=r"step 'talk' \(prompt_agent\) failed: No human-A2A URL configured: set "
                                         r"user_a2a_url, deploy the user agent 'human_agent' \(Agent with name "
                                         r"'human_agent' not found .*AGENT_ENV_HUMAN_A2A_URL$"):
        run_steps(project, [deploy("coder", "coder"),
                            {**prompt(prompt="Write a file", max_conversation_turns=2), "depends_on": ["deploy-coder"]}])
    assert user_endpoint(TaskStepContext(), "http://127.0.0.1:9/", "nobody").url == "http://127.0.0.1:9/"


@pytest.fixture
def human(tmp_path):
    """An A2A user outside the task (a person's chat client, say): a replay agent the test
    serves itself. It is none of the run's servers, so the run sends it no token."""
    from fakes.messages_api import ThreadedServer

    from agentenv_dagster.builtin.agents.brains import build_brain
    from agentenv_dagster.builtin.agents.server import EmbeddedAgent, build_app, build_card
    from agentenv_dagster.runtime.sandbox import LocalSandbox

    brain = build_brain("replay", {"episodes": [{"match": "wrote a", "reply": "Now b please"},
                                                {"match": "wrote b", "reply": "Now c please"}]})
    (tmp_path / "human-box").mkdir()
    card = build_card("human", "A person at a chat client")
    with ThreadedServer(build_app(EmbeddedAgent(brain, LocalSandbox(tmp_path / "human-box")), card)) as server:
        for interface in card.supported_interfaces:
            interface.url = server.url + "/"
        yield server.url


@pytest.mark.parametrize("how", ["user_a2a_url", "AGENT_ENV_HUMAN_A2A_URL"])
def test_an_external_user_answers_from_its_url(project, human, monkeypatch, how):
    fields = {"user_a2a_url": human} if how == "user_a2a_url" else {}
    if how == "AGENT_ENV_HUMAN_A2A_URL":
        monkeypatch.setenv("AGENT_ENV_HUMAN_A2A_URL", human)
    context = run_steps(project, [deploy("coder", "coder"), {
        **prompt(prompt="Write a file", max_conversation_turns=3, **fields), "depends_on": ["deploy-coder"]}])
    response = context.find_prompt_response("p")
    assert [t["user_message"] for t in response.model_extra["turns"]] == ["Write a file", "Now b please", "Now c please"]
    assert response.response == "wrote c"


@pytest.mark.parametrize("fields, message", [
    ({"max_conversation_turns": 0, "prompt": "x"}, "max_conversation_turns must be >= 1"),
    ({"user_opens_conversation": True, "prompt": "x"}, "`user_opens_conversation` has the user agent write the opener"),
    ({"prompt": "x", "turn_criteria": {"criteria": []}}, "turn_criteria needs a `sandbox_name`"),
])
def test_conversation_fields_are_checked(fields, message):
    from agentenv_dagster.steps.prompt import PromptAgentStep

    with pytest.raises(ValueError, match=message):
        PromptAgentStep(id="s", type="prompt_agent", **fields)
