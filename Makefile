# The two commands a newcomer runs: `make demo` and `make test`.
# Both create .venv when it is missing and install speechpipe into it (editable), pinned by
# constraints.txt to the torch build this machine has on disk. `make demo` installs only what
# the demo needs (speechpipe and its requirements, no test extra), quietly; `make test` adds
# the test extra.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.speechpipe-installed
DEMO_STAMP := $(VENV)/.speechpipe-demo-installed
PIP    := $(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt

.PHONY: demo test quick install bench clean

$(STAMP): setup.cfg pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip setuptools wheel
	$(PIP) -e '.[test]'
	touch $(STAMP)

$(DEMO_STAMP): setup.cfg pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) --quiet --upgrade pip setuptools wheel
	$(PIP) --quiet --no-warn-script-location -e .
	touch $(DEMO_STAMP)

install: $(STAMP)

demo: $(DEMO_STAMP)
	$(VENV)/bin/speechpipe demo

test: $(STAMP)
	$(PY) -m benchmarks --tiny
	$(PY) -m pytest -q

# The edit-test loop: the suite without the tests marked slow (tests/conftest.py), no benchmarks.
quick: $(STAMP)
	$(PY) -m pytest -q -m "not slow" -x

bench: $(STAMP)
	$(PY) -m benchmarks

clean:
	rm -rf $(VENV) build *.egg-info
