# `make test` installs what the tests need (redis-server, PostgreSQL, etcd,
# promtool) and runs the whole suite against real servers, in every module.
GO ?= go
STATICCHECK_VERSION ?= v0.8.2
GOBIN ?= $(shell $(GO) env GOPATH)/bin
# Every module of the repository (see README, "Modules"): the library at the
# root, then the modules that carry heavier dependencies.
MODULES := . internal/testpg etcdstore fence/pgfence pgstore prommetrics otelleasehold cmd/leasehold

.PHONY: test deps gotest lint modgraph rules drill build

test: deps lint modgraph gotest rules

deps:
	bash scripts/install-test-deps.sh

gotest:
	@set -e; for m in $(MODULES); do echo "== go test $$m"; (cd $$m && $(GO) test -race -count=1 -timeout 20m ./...); done

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed: $$out"; exit 1; fi
	@test -x $(GOBIN)/staticcheck || $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	@set -e; for m in $(MODULES); do echo "== vet, staticcheck $$m"; (cd $$m && $(GO) vet ./... && $(GOBIN)/staticcheck ./...); done

# The library's module graph must stay small (issue 14).
modgraph:
	bash scripts/check-module-graph.sh

rules:
	@if [ -d deploy/prometheus ]; then promtool check rules deploy/prometheus/alerts.yml && promtool test rules deploy/prometheus/alerts_test.yml; fi

# grpcnotrace drops grpc's golang.org/x/net/trace, whose html/template use
# turns off the linker's dead-method elimination for the whole binary
# (41.9 MB -> 28.7 MB; see README, "Modules").
build:
	cd cmd/leasehold && $(GO) build -tags grpcnotrace -o ../../bin/leasehold .

drill:
	cd cmd/leasehold && $(GO) run . drill
