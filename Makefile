# nsfast — `make demo` is the two-minute tour; `make bench` is the full comparison.
CARGO  ?= cargo
NSFAST := target/release/nsfast
# nsfast bench creates network namespaces and cgroups: it needs root.
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
OUT    ?= bench-results

.PHONY: build demo bench bench-deps test
build:
	$(CARGO) build --release -p nsfast

# host / veth / routed / sockmap, every workload, 3 interleaved rounds: table + JSON + SVGs.
demo: build
	$(SUDO) $(NSFAST) bench --quick --json $(OUT)/bench.json

# Longer run, both CPU placements, with the sockperf/iperf3 cross-check.
bench: build bench-deps
	$(SUDO) $(NSFAST) bench --placement same-cpu,cross-cpu --cross-check --json $(OUT)/bench.json

# sockperf and iperf3 are only needed for --cross-check.
bench-deps:
	@command -v sockperf >/dev/null && command -v iperf3 >/dev/null || \
	  ($(SUDO) apt-get update && $(SUDO) apt-get install -y sockperf iperf3)

test:
	$(SUDO) $(CARGO) test --workspace
