# Kiln developer tasks. Every path is relative to the repository root; run make from there.
#
#   make venv    create .venv and install Kiln with its test extras (re-runs when pyproject.toml changes)
#   make demo    train the bundled digits CNN, compile it with kiln, compare accuracies
#   make test    run the test suite (needs node >= 18 for the Netron check; sets up the aarch64 emulator)
#   make lint    ruff + mypy
#   make clean   remove demo output and caches (make distclean also removes .venv)

PYTHON ?= $(shell command -v python3.11 >/dev/null 2>&1 && echo python3.11 || echo python3)
VENV := .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
# The install stamp is named after pyproject.toml's content, so editing dependencies re-installs.
DEPS_HASH := $(shell (sha256sum pyproject.toml 2>/dev/null || shasum -a 256 pyproject.toml) | cut -c1-12)
STAMP := $(VENV)/.stamp-$(DEPS_HASH)
DEMO := demo-out

.PHONY: venv demo test lint node arm clean distclean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -e '.[test]'
	rm -f $(VENV)/.stamp-*
	touch $@

demo: venv
	$(PY) -m examples.digits.train $(DEMO)/example
	$(BIN)/kiln compile $(DEMO)/example/digits_cnn.onnx -o $(DEMO)/compiled --emit onnx --target cpu \
		--inputs $(DEMO)/example/digits_inputs.npz
	$(BIN)/kiln compile $(DEMO)/example/digits_cnn.onnx -o $(DEMO)/compiled-int8 --quantize int8 \
		--calib $(DEMO)/example/digits_calib.npz --inputs $(DEMO)/example/digits_inputs.npz
	$(PY) -m examples.digits.accuracy --holdout $(DEMO)/example/digits_holdout.npz \
		$(DEMO)/example/digits_cnn.onnx $(DEMO)/compiled/model.onnx $(DEMO)/compiled-int8/model.onnx

test: venv lint node arm
	$(PY) -m pytest -q

# The ARM tests run aarch64 libraries under qemu over TVM RPC: scripts/setup_arm.sh installs qemu
# and the cross toolchain (apt, as root) and an aarch64 Python with the TVM runtime into .arm/.
arm: venv
	PIP=$(BIN)/pip bash scripts/setup_arm.sh

# The CANN tests run Netron's .om reader headless under Node.js (tests/helpers/netron_check.mjs).
node:
	@command -v node >/dev/null 2>&1 || { echo "error: node not found: the Netron check in the CANN tests needs Node.js >= 18 (e.g. apt-get install nodejs)" >&2; exit 1; }
	@node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 18 ? 0 : 1)' || { echo "error: node $$(node --version) is too old: the Netron check needs Node.js >= 18" >&2; exit 1; }

lint: venv
	$(BIN)/ruff check .
	$(BIN)/mypy

clean:
	rm -rf $(DEMO) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
