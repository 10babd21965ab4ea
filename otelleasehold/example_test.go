package otelleasehold_test

import (
	"context"
	"fmt"
	"log/slog"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/memstore"
	"github.com/leasehold/leasehold/otelleasehold"
)

func Example() {
	rec := tracetest.NewSpanRecorder() // in production: an OTLP exporter
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()

	locker, err := leasehold.New(memstore.New(), leasehold.Options{
		Name: "approval", Observer: otelleasehold.New(tp), Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		panic(err)
	}
	defer locker.Close()
	ctx := context.Background()
	lease, err := locker.TryAcquire(ctx, "invoice/1")
	if err != nil {
		panic(err)
	}
	_ = lease.Release(ctx)
	for _, s := range rec.Ended() {
		fmt.Println(s.Name())
	}
	// Output:
	// leasehold.acquire
	// leasehold.release
	// leasehold.lease
}
