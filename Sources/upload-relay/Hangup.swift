import ServiceLifecycle
import UnixSignals

/// SIGHUP, trapped from the start of `serve`: one that comes before the relay is ready waits in the sequence, and runs
/// once ``ReloadOnHangup`` does (certbot's deploy hook may signal a relay still waiting for PostgreSQL).
struct Hangup: Sendable {
    let signals: UnixSignalsSequence

    init() async {
        self.signals = await UnixSignalsSequence(trapping: .sighup)
    }
}

/// Runs `reload` for each SIGHUP, one at a time (a reload never runs beside another), until the relay's group shuts
/// down: a service of that group.
struct ReloadOnHangup: Service {
    let hangup: Hangup
    let reload: @Sendable () -> Void

    func run() async {
        for await _ in self.hangup.signals.cancelOnGracefulShutdown() {
            self.reload()
        }
    }
}
