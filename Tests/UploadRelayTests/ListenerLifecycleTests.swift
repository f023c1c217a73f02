import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded
import Testing

@testable import UploadRelay

/// ``ListenerLifecycle``'s admission: connections that have not authenticated (strangers) have a pool of their own
/// and a cap per source address, and never take the places of authenticated connections.
@Suite("Listener admission")
struct ListenerLifecycleTests {
    /// A lifecycle listening on an embedded channel.
    static func listening(maxConnections: Int, strangers: StrangerLimits) async throws -> (ListenerLifecycle, EmbeddedChannel) {
        let lifecycle = ListenerLifecycle(maxConnections: maxConnections, strangers: strangers)
        let listener = EmbeddedChannel()
        listener.localAddress = try SocketAddress(ipAddress: "127.0.0.1", port: 7443)
        try await listener.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 7443)).get()
        _ = try await lifecycle.listen { listener }
        return (lifecycle, listener)
    }

    /// An accepted connection from `ip`.
    static func connection(from ip: String) throws -> EmbeddedChannel {
        let channel = EmbeddedChannel()
        let address = try SocketAddress(ipAddress: ip, port: 40000)
        channel.connect(to: address, promise: nil)
        channel.remoteAddress = address
        return channel
    }

    @Test("one source holds at most its cap of strangers; another source is still admitted; a closed stranger frees its place")
    func perSource() async throws {
        let (lifecycle, listener) = try await Self.listening(maxConnections: 10, strangers: StrangerLimits(perSource: 3, total: 8))
        defer { _ = try? listener.finish() }
        let flood = try (0..<3).map { _ in try Self.connection(from: "127.0.0.2") }
        defer { for channel in flood { _ = try? channel.finish() } }
        for channel in flood { #expect(lifecycle.admit(channel) == nil) }
        #expect(lifecycle.admit(try Self.connection(from: "127.0.0.2")) == .sourceFull)
        // IPv4-mapped IPv6 is the same host.
        #expect(lifecycle.admit(try Self.connection(from: "::ffff:127.0.0.2")) == .sourceFull)
        let honest = try Self.connection(from: "127.0.0.1")
        #expect(lifecycle.admit(honest) == nil)
        try await flood[0].close()
        flood[0].embeddedEventLoop.run()
        #expect(lifecycle.admit(try Self.connection(from: "127.0.0.2")) == nil)
        #expect(lifecycle.connections.count == 4)
    }

    @Test("a full pool of strangers closes its oldest to admit a new one; authenticated connections are never evicted")
    func poolEvictsOldest() async throws {
        let (lifecycle, listener) = try await Self.listening(maxConnections: 10, strangers: StrangerLimits(perSource: 2, total: 4))
        defer { _ = try? listener.finish() }
        let first = try Self.connection(from: "10.0.0.1")
        #expect(lifecycle.admit(first) == nil)
        #expect(lifecycle.authenticated(first))
        var strangers: [EmbeddedChannel] = []
        for i in 0..<4 {
            let channel = try Self.connection(from: "10.0.1.\(i)")
            #expect(lifecycle.admit(channel) == nil)
            strangers.append(channel)
        }
        let newest = try Self.connection(from: "10.0.2.1")
        #expect(lifecycle.admit(newest) == nil)
        #expect(!strangers[0].isActive, "the oldest stranger was closed")
        for stranger in strangers.dropFirst() { #expect(stranger.isActive) }
        #expect(first.isActive, "an authenticated connection is not a stranger")
        #expect(lifecycle.connections.count == 5)
    }

    @Test("a listener that does not evict refuses a stranger past its pool, and keeps its oldest")
    func poolRefuses() async throws {
        let limits = StrangerLimits(perSource: 8, total: 2, evictsOldest: false)
        let (lifecycle, listener) = try await Self.listening(maxConnections: 2, strangers: limits)
        defer { _ = try? listener.finish() }
        let first = try Self.connection(from: "10.0.0.1")
        #expect(lifecycle.admit(first) == nil)
        #expect(lifecycle.admit(try Self.connection(from: "10.0.0.2")) == nil)
        #expect(lifecycle.admit(try Self.connection(from: "10.0.0.3")) == .poolFull)
        #expect(first.isActive)
    }

    @Test("authenticated connections have their own places: strangers never take them, and one past them is refused")
    func authenticatedPlaces() async throws {
        let (lifecycle, listener) = try await Self.listening(maxConnections: 2, strangers: StrangerLimits(perSource: 4, total: 8))
        defer { _ = try? listener.finish() }
        let agents = try (0..<3).map { try Self.connection(from: "192.0.2.\($0)") }
        for agent in agents { #expect(lifecycle.admit(agent) == nil) }
        // A stranger pool full of idle connections does not stop an agent from authenticating.
        for i in 0..<4 { _ = lifecycle.admit(try Self.connection(from: "198.51.100.\(i)")) }
        #expect(lifecycle.authenticated(agents[0]) || lifecycle.authenticated(agents[1]) || lifecycle.authenticated(agents[2]))
        let placed = agents.filter { lifecycle.authenticated($0) }
        #expect(placed.count == 2, "two places, whichever two took them")
        // A source's cap counts strangers only: an authenticated connection no longer counts against it.
        for _ in 0..<4 { #expect(lifecycle.admit(try Self.connection(from: "192.0.2.0")) == nil) }
    }

    @Test("the source of an IPv6 peer is its /64; of an IPv4 one its address")
    func sources() throws {
        #expect(ListenerLifecycle.source(of: try SocketAddress(ipAddress: "2001:db8:1:2::5", port: 1)) == "20010db800010002/64")
        #expect(ListenerLifecycle.source(of: try SocketAddress(ipAddress: "2001:db8:1:2:ffff::9", port: 1)) == "20010db800010002/64")
        #expect(ListenerLifecycle.source(of: try SocketAddress(ipAddress: "203.0.113.7", port: 1)) == "203.0.113.7")
        #expect(ListenerLifecycle.source(of: nil) == "local")
    }
}

@Suite("Bounded log")
struct BoundedLogTests {
    @Test("a flood of warnings writes one line per interval, counting those it held back")
    func bounded() {
        let lines = LogCapture()
        let log = BoundedLog(logger: lines.logger, interval: .seconds(10))
        let start = NIODeadline.uptimeNanoseconds(1_000_000_000)
        for i in 0..<10_000 {
            log.warning("refused", now: start + .milliseconds(Int64(i)))
        }
        #expect(lines.count == 1)
        log.warning("refused", now: start + .seconds(11))
        #expect(lines.count == 2)
        #expect(lines.last?.contains("suppressed=9999") == true)
    }
}

/// A logger whose lines are kept, each as "message key=value ...".
final class LogCapture: Sendable {
    private let lines = NIOLockedValueBox<[String]>([])

    var logger: Logger {
        Logger(label: "capture") { _ in Handler(capture: self) }
    }
    var count: Int { self.lines.withLockedValue { $0.count } }
    var last: String? { self.lines.withLockedValue { $0.last } }
    var all: [String] { self.lines.withLockedValue { $0 } }

    struct Handler: LogHandler {
        let capture: LogCapture
        var metadata: Logger.Metadata = [:]
        var logLevel: Logger.Level = .trace

        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { self.metadata[key] }
            set { self.metadata[key] = newValue }
        }

        func log(event: LogEvent) {
            let all = self.metadata.merging(event.metadata ?? [:]) { $1 }
            let text = ([event.message.description] + all.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }).joined(separator: " ")
            self.capture.lines.withLockedValue { $0.append(text) }
        }
    }
}
