# Atrium — run `make help` for the targets.
GO       ?= go
BIN      ?= bin/atrium
DATA     ?= .atrium
LISTEN   ?= 127.0.0.1:7080
PKGS     ?= ./...

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-8s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build bin/atrium.
	@echo "Building $(BIN): the first build downloads the Go modules and compiles for a few minutes, listing each package; later builds take seconds."
	$(GO) build -v -o $(BIN) ./cmd/atrium
	@echo "Built $(BIN)."

.PHONY: run
run: build ## Build and run Atrium on the embedded defaults (embedded NATS, local store, local sandboxes).
	@echo "Starting: $(BIN) dev --listen $(LISTEN) --data $(DATA)"
	@./$(BIN) dev --listen $(LISTEN) --data $(DATA)

.PHONY: test
test: ## Run every test (installs bubblewrap first if it is missing and you are root).
	@.ci/deps
	$(GO) test -race -count=1 -timeout 12m $(PKGS)

.PHONY: bench
bench: build ## Run the Go benchmarks and `atrium bench`.
	$(GO) test -run '^$$' -bench . -benchtime 2s $(PKGS)
	./$(BIN) bench

.PHONY: lint
lint: ## gofmt and go vet.
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)

.PHONY: check
check: lint test ## gofmt, go vet and the tests: run before every commit.

.PHONY: clean
clean: ## Remove build output (not the data dir).
	rm -rf bin
