import NIOConcurrencyHelpers
import UploadProtocol

/// The stripes of one striped upload (SPEC §6.7), shared by the connections that send them: which are complete, and
/// the failure that gave one up. The main job's stream sends HASH once every stripe is complete.
final class StripeSet: Sendable {
    /// The relay's name for the upload: every PART carries it.
    let token: [UInt8]
    let stripes: Frame.Stripes
    private let state = NIOLockedValueBox<(complete: Set<Int>, failure: String?)>(([], nil))

    init(token: [UInt8], size: UInt64) {
        self.token = token
        self.stripes = Frame.Stripes(size: size)
    }

    /// Stripe `index` is durable at the relay (RESULT or OFFSET STORED on its PART stream).
    func complete(_ index: Int) {
        self.state.withLockedValue { _ = $0.complete.insert(index) }
    }

    func isComplete(_ index: Int) -> Bool {
        self.state.withLockedValue { $0.complete.contains(index) }
    }

    /// Every stripe after the first is complete.
    var allComplete: Bool {
        let count = self.stripes.count
        return self.state.withLockedValue { $0.complete.count >= count - 1 }
    }

    /// A stripe was given up: the upload fails with this reason.
    func fail(_ reason: String) {
        self.state.withLockedValue { if $0.failure == nil { $0.failure = reason } }
    }

    var failure: String? { self.state.withLockedValue { $0.failure } }
}
