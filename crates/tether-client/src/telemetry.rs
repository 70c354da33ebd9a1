//! What the client counts, through the `metrics` facade (a no-op until the application installs
//! a recorder; `tether connect --metrics` and `tether watch --metrics` install a Prometheus one).

/// Describes the client's metrics (the `# HELP` lines of a Prometheus scrape) and makes the
/// series known in advance present from the start, at zero. Call it once the recorder is
/// installed.
pub fn describe_metrics() {
    use metrics::describe_counter;
    describe_counter!(
        "tether_client_divergences_total",
        "Resumes the client could not prove continuous, by kind: it re-initialized or gave up."
    );
    describe_counter!(
        "tether_client_resyncs_total",
        "resync events that continued a stream past a range the server said is gone, by reason."
    );
    describe_counter!("tether_client_reinitializations_total", "Sessions the client replaced after a divergence.");
    describe_counter!("tether_client_reissues_total", "Requests sent again after their stream was lost.");
    for kind in crate::DivergenceReason::KINDS {
        metrics::counter!("tether_client_divergences_total", "kind" => kind).increment(0);
    }
    metrics::counter!("tether_client_reinitializations_total").increment(0);
    metrics::counter!("tether_client_reissues_total").increment(0);
    for reason in [
        tether_core::lineage::ResyncReason::Evicted,
        tether_core::lineage::ResyncReason::UnknownStream,
        tether_core::lineage::ResyncReason::RequestAborted,
    ] {
        metrics::counter!("tether_client_resyncs_total", "reason" => reason.as_str()).increment(0);
    }
}
