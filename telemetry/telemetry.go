// Package telemetry wires Relay's OpenTelemetry metrics to a Prometheus
// /metrics endpoint. (Traces need nothing from here: configure an
// OpenTelemetry TracerProvider as usual; see docs/observability.md.)
//
//	mp, handler, err := telemetry.Prometheus()
//	otel.SetMeterProvider(mp)          // enqueue counters use the global provider
//	http.Handle("/metrics", handler)
//	client, err := core.NewClient(pool, &core.Config{Workers: ws, MeterProvider: mp})
package telemetry

import (
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// Prometheus returns a MeterProvider whose metrics the returned handler
// serves in Prometheus' text format, on a registry of its own (so two calls
// do not collide, and nothing is registered globally).
func Prometheus() (*sdkmetric.MeterProvider, http.Handler, error) {
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, nil, fmt.Errorf("telemetry: prometheus exporter: %w", err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	return mp, promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), nil
}
