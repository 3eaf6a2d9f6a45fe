#!/usr/bin/env bash
# The agent examples that learn on the CPU, one command each (the README's "what it has learned" table):
#   bash scripts/learn.sh twenty-questions [--seed N ...]   # CrewAI Twenty Questions (examples/crewai_twenty_questions/learn.py)
#   bash scripts/learn.sh tool-agent [--seed N ...]         # the LangGraph tool agent (examples/langgraph_tool_agent/learn.py)
# Each installs the framework it needs (the package's `crewai` or `langchain` extra), builds the tiny model on
# first use, then runs the example's supervised warm start, GRPO through the proxy and held-out evaluations.
# Extra arguments go to the example's learn.py (try --help; --quick checks the pipeline in a few minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
example="${1:-}"
case "$example" in
  twenty-questions) extra=crewai script=examples/crewai_twenty_questions/learn.py ;;
  tool-agent) extra=langchain script=examples/langgraph_tool_agent/learn.py ;;
  *)
    echo "usage: bash scripts/learn.sh twenty-questions|tool-agent [learn.py arguments]" >&2
    echo "got: ${example:-no example}; expected one of: twenty-questions, tool-agent" >&2
    exit 2
    ;;
esac
shift
bash scripts/setup.sh "$extra"
export LITELLM_LOCAL_MODEL_COST_MAP=True HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export CREWAI_DISABLE_TELEMETRY=true CREWAI_DISABLE_TRACKING=true CREWAI_TRACING_ENABLED=false CREWAI_TESTING=true
exec .venv/bin/python "$script" "$@"
