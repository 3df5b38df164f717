"""agent/llm/settings.py: where the LLM configuration comes from, and that the key stays out of files."""

import pytest

from agent.llm.settings import LLMSettings, SettingsError, load_llm_settings

PYPROJECT = """
[tool.agent]
task = "matmul_cpu"
model = "file-model"
base_url = "http://file:8000/v1"
timeout_s = 42
budget_usd = 1.5

[tool.agent.prices]
file-model = { input = 1.0, output = 2.0 }
cli-model = { input = 3.0, output = 4.0 }
"""


@pytest.fixture
def repo(tmp_path):
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)
    return tmp_path


def test_nothing_configured_means_no_llm(tmp_path):
    assert load_llm_settings({}, tmp_path, environ={}) is None
    # a stray OPENAI_API_KEY alone does not switch the agent to the LLM
    assert load_llm_settings({}, tmp_path, environ={"OPENAI_API_KEY": "sk-x"}) is None


def test_file_then_env_then_cli(repo):
    s = load_llm_settings({}, repo, environ={})
    assert (s.model, s.base_url, s.timeout_s, s.budget_usd) == ("file-model", "http://file:8000/v1", 42, 1.5)
    assert s.price().input == 1.0

    s = load_llm_settings({}, repo, environ={"AGENT_MODEL": "cli-model", "OPENAI_BASE_URL": "http://env/v1"})
    assert (s.model, s.base_url, s.timeout_s) == ("cli-model", "http://env/v1", 42)


def test_budget_usd_needs_a_price(repo):
    # a budget in dollars that can never be reached is refused, not silently ignored
    with pytest.raises(SettingsError, match="^LLM settings: budget_usd is set but model 'env-model' has no price"):
        load_llm_settings({}, repo, environ={"AGENT_MODEL": "env-model"})


def test_cli_wins_and_none_values_are_ignored(repo):
    s = load_llm_settings({"model": "cli-model", "base_url": None, "budget_tokens": 1000}, repo,
                          environ={"AGENT_MODEL": "env-model", "AGENT_BASE_URL": "http://agent/v1",
                                   "OPENAI_BASE_URL": "http://openai/v1"})
    assert (s.model, s.base_url, s.budget_tokens) == ("cli-model", "http://agent/v1", 1000)


def test_key_from_env_only_and_never_serialized(tmp_path):
    s = load_llm_settings({"model": "gpt-x"}, tmp_path, environ={"OPENAI_API_KEY": "sk-open",
                                                                "AGENT_API_KEY": "sk-agent"})
    assert s.key() == "sk-agent" and s.base_url is None
    assert "sk-agent" not in s.model_dump_json() and "sk-agent" not in repr(s)
    assert "api_key" not in s.model_dump()


def test_key_in_pyproject_is_refused(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.agent]\nmodel = "m"\napi_key = "sk-oops"\n')
    with pytest.raises(SettingsError, match="never commit a key"):
        load_llm_settings({}, tmp_path, environ={})


def test_openai_without_key_or_local_without_model(tmp_path):
    with pytest.raises(SettingsError, match="no API key for OpenAI"):
        load_llm_settings({"model": "gpt-x"}, tmp_path, environ={})
    with pytest.raises(SettingsError, match="no model"):
        load_llm_settings({"base_url": "http://localhost:11434/v1"}, tmp_path, environ={})
    local = load_llm_settings({"model": "qwen2.5-coder", "base_url": "http://localhost:11434/v1"}, tmp_path, environ={})
    assert local.key() == "not-needed"


def test_bad_values_name_the_field(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.agent]\nmodel = "m"\nbase_url = "http://x/v1"\ntimeout_s = -1\n')
    with pytest.raises(SettingsError, match="timeout_s: Input should be greater than 0"):
        load_llm_settings({}, tmp_path, environ={})
    with pytest.raises(Exception):
        LLMSettings(model="m", structured="xml")
