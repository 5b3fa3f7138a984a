# advm: two commands. Both install what they need on a fresh Debian machine.
#   make demo   every capability on its built-in workload against its baseline, one table
#   make test   fmt check, clippy -D warnings, API docs without warnings, all tests

# rustup installs into ~/.cargo/bin, which a fresh shell's PATH may lack: put it on PATH
# here so the cargo that deps-rust installs is the one the next rules run.
export PATH := $(HOME)/.cargo/bin:$(PATH)
CARGO ?= cargo
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_PACKAGES := build-essential pkg-config qemu-utils qemu-system-x86 debootstrap busybox-static cpio python3 python3-pip python3-venv \
	r-base-core r-cran-randomforest r-cran-kernlab r-cran-e1071 r-cran-rpart r-cran-nnet \
	r-cran-gbm r-cran-class r-cran-glmnet python3-numpy python3-pandas \
	openjdk-17-jdk-headless

.PHONY: demo test deps deps-system deps-rust deps-python deps-python-bench build release fmt clippy doc test-python

# The Python package's tests and `advm bench merge` run in this virtualenv.
PYENV := target/pyenv
PY := $(PYENV)/bin/python

deps: deps-system deps-rust

# Debian packages the tests and demo use; installed only when missing.
deps-system:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		$(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	fi

# A stable Rust toolchain with rustfmt and clippy (rustup when cargo is absent).
deps-rust:
	@command -v $(CARGO) >/dev/null 2>&1 || { \
		echo "installing rust via rustup"; \
		curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --component rustfmt,clippy; }
	@$(CARGO) fmt --version >/dev/null 2>&1 || rustup component add rustfmt
	@$(CARGO) clippy --version >/dev/null 2>&1 || rustup component add clippy

# maturin builds the advm wheel, pytest runs its tests, mypy checks its type hints
# (PyPI, into $(PYENV)).
deps-python: deps-system
	@test -x $(PY) || python3 -m venv $(PYENV)
	@$(PY) -m pip install -q --disable-pip-version-check maturin numpy pytest mypy

# What `advm bench merge` runs: onnxruntime serving ONNX models built with onnx, and
# the PP-OCR models shipped inside rapidocr-onnxruntime.
deps-python-bench: deps-python
	@$(PY) -m pip install -q --disable-pip-version-check onnx onnxruntime rapidocr-onnxruntime

release: deps
	$(CARGO) build --release --workspace

# The vm-density row boots VMs from the guest `advm vm image build` makes from Debian's
# registry (about 80 s the first time, cached after): built here so a fresh machine's demo
# has the row; if the build fails the row says why and the others still run.
demo: release
	./target/release/advm doctor
	@echo
	./target/release/advm vm image build || echo "advm vm image build failed: the vm-density row will say why"
	./target/release/advm demo

fmt:
	$(CARGO) fmt --all -- --check

clippy:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# The API docs build without a warning (broken or private intra-doc links).
doc:
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --no-deps --workspace

# cargo test builds only rlibs; the C tests need libadvm.so from cargo build.
test: deps fmt clippy doc
	$(CARGO) build --workspace
	$(CARGO) test --workspace
	$(MAKE) test-python

# Builds and installs the abi3 wheel from crates/advm-py, then runs its pytest suite.
test-python: deps-python
	$(PY) -m pip install -q --disable-pip-version-check ./crates/advm-py
	$(PY) -m pytest -q crates/advm-py/tests
