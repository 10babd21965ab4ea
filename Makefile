# `make test` installs what the tests need (redis-server, PostgreSQL,
# promtool) and runs the whole suite against real servers.
GO ?= go
STATICCHECK_VERSION ?= v0.8.2
GOBIN ?= $(shell $(GO) env GOPATH)/bin

.PHONY: test deps gotest lint rules drill build

test: deps lint gotest rules

deps:
	bash scripts/install-test-deps.sh

gotest:
	$(GO) test -race -count=1 -timeout 20m ./...

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed: $$out"; exit 1; fi
	$(GO) vet ./...
	@test -x $(GOBIN)/staticcheck || $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	$(GOBIN)/staticcheck ./...

rules:
	@if [ -d deploy/prometheus ]; then promtool check rules deploy/prometheus/alerts.yml && promtool test rules deploy/prometheus/alerts_test.yml; fi

build:
	$(GO) build -o bin/leasehold ./cmd/leasehold

drill:
	$(GO) run ./cmd/leasehold drill
