//! OpenTelemetry export: spans and the MCP conventions' metrics over OTLP/HTTP (protobuf), when
//! `--otlp-endpoint` or the standard `OTEL_EXPORTER_OTLP_*ENDPOINT` variables say where to.
//! Nothing is exported, and nothing recorded, otherwise.

use anyhow::Context as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::trace::SdkTracerProvider;

/// The standard variables that name an OTLP endpoint.
const ENDPOINT_VARIABLES: [&str; 3] =
    ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"];

/// The exporting providers, installed as the global ones; flushed by [`Otel::shutdown`].
pub struct Otel {
    traces: SdkTracerProvider,
    metrics: SdkMeterProvider,
}

/// Installs exporting providers if an endpoint is configured: `endpoint` (the collector's base
/// URL, to which `/v1/traces` and `/v1/metrics` are added, as for `OTEL_EXPORTER_OTLP_ENDPOINT`),
/// else the standard variables. `service` names this process unless `OTEL_SERVICE_NAME` does.
pub fn install(endpoint: Option<&str>, service: &'static str) -> anyhow::Result<Option<Otel>> {
    let configured = endpoint.is_some() || ENDPOINT_VARIABLES.iter().any(|name| std::env::var_os(name).is_some());
    let disabled = std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.eq_ignore_ascii_case("true"));
    if !configured || disabled {
        return Ok(None);
    }
    // The exporter's HTTP client takes the process's TLS provider.
    tether_client::tls::install_provider();
    let base = endpoint.map(|e| e.trim_end_matches('/').to_owned());
    let mut spans = opentelemetry_otlp::SpanExporter::builder().with_http();
    let mut measures = opentelemetry_otlp::MetricExporter::builder().with_http();
    if let Some(base) = &base {
        spans = spans.with_endpoint(format!("{base}/v1/traces"));
        measures = measures.with_endpoint(format!("{base}/v1/metrics"));
    }
    let spans = spans.build().context("the OTLP span exporter")?;
    let measures = measures.build().context("the OTLP metric exporter")?;
    let resource = match std::env::var_os("OTEL_SERVICE_NAME") {
        Some(_) => Resource::builder().build(),
        None => Resource::builder().with_service_name(service).build(),
    };
    let traces = SdkTracerProvider::builder().with_batch_exporter(spans).with_resource(resource.clone()).build();
    let metrics = SdkMeterProvider::builder().with_periodic_exporter(measures).with_resource(resource).build();
    opentelemetry::global::set_tracer_provider(traces.clone());
    opentelemetry::global::set_meter_provider(metrics.clone());
    tether_server::trace::enable();
    tracing::info!(
        endpoint = base.as_deref().unwrap_or("from OTEL_EXPORTER_OTLP_*"),
        "exporting OpenTelemetry traces and metrics"
    );
    Ok(Some(Otel { traces, metrics }))
}

impl Otel {
    /// Exports what is still buffered and stops. Blocks: call it off the async runtime.
    pub fn shutdown(self) {
        if let Err(err) = self.traces.shutdown() {
            tracing::warn!(%err, "flushing the OpenTelemetry spans failed");
        }
        if let Err(err) = self.metrics.shutdown() {
            tracing::warn!(%err, "flushing the OpenTelemetry metrics failed");
        }
    }
}
