import Foundation
import Testing

@testable import UploadRelay

/// `token delete`, `revoke`, `disable` and `rotate` return once every running relay has told its connections: the
/// catalog's record of each relay's last look at the accounts (``RelayAdmin/waitForLooks(catalog:after:timeout:live:)``).
@Suite("Admin changes wait for the relays' looks")
struct RelayLooksTests {
    @Test("a running relay behind the change is waited for until it looks; one gone for long is not; one that never looks is counted silent")
    func waits() async throws {
        let catalog = InMemoryCatalog()
        let change = Date()
        try await catalog.recordLook(relay: "running", readAt: change.addingTimeInterval(-1))
        try await catalog.recordLook(relay: "gone", readAt: change.addingTimeInterval(-60))
        let waiting = Task { try await RelayAdmin.waitForLooks(catalog: catalog, after: change, timeout: .seconds(30)) }
        // The running relay's next look, after the change: the wait ends with it, well before its timeout.
        try await catalog.recordLook(relay: "running", readAt: change.addingTimeInterval(0.5))
        let looks = try await waiting.value
        #expect(looks == RelayAdmin.Looks(told: 1, silent: 0))

        try await catalog.recordLook(relay: "stuck", readAt: change.addingTimeInterval(-2))
        let started = ContinuousClock.now
        let silent = try await RelayAdmin.waitForLooks(catalog: catalog, after: change.addingTimeInterval(0.1), timeout: .milliseconds(300))
        #expect(silent == RelayAdmin.Looks(told: 1, silent: 1))
        #expect(ContinuousClock.now - started >= .milliseconds(300))
        #expect(try await RelayAdmin.waitForLooks(catalog: InMemoryCatalog(), after: change) == RelayAdmin.Looks(), "no relay: nothing to wait for")
    }
}
