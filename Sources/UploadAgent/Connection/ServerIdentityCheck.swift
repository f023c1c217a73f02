import NIOCore
import NIOSSL
import NIOTLS

/// Checks that the relay's certificate is valid for the name the user gave (`--server-name`, else the host of
/// `--relay`), and for nothing else. NIOSSL's own check also accepts any certificate that lists the address connected
/// to, whatever name was asked for; the agent's TLS therefore verifies the chain only (`.noHostnameVerification`), and
/// this handler, right behind TLS, checks the name once the handshake is done. A mismatch is
/// `NIOSSLExtraError.failedToValidateHostname`, and the connection closes before a frame is sent; a match takes the
/// handler out of the pipeline, so that no read of the connection passes through it.
final class ServerIdentityCheck: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer

    /// What the certificate must be valid for.
    enum Expected: Hashable, Sendable {
        /// A DNS name: only the certificate's DNS names count (RFC 6125 §6.4, a wildcard for the leftmost label).
        case name(String)
        /// An address the user gave as the relay's host (no server name): only the certificate's IP addresses count.
        case address([UInt8])
    }

    private let expected: Expected

    init(expected: Expected) {
        self.expected = expected
    }

    /// What `host` asks for, with `serverName` (nil: none given).
    static func expected(host: String, serverName: String?) -> Expected {
        if let serverName { return .name(serverName) }
        if let address = try? SocketAddress(ipAddress: host, port: 0), let bytes = Self.bytes(of: address) { return .address(bytes) }
        return .name(host)
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        guard case TLSUserEvent.handshakeCompleted = event else {
            context.fireUserInboundEventTriggered(event)
            return
        }
        let leaf = Self.peerCertificate(context)
        let names = leaf.map { $0._subjectAlternativeNames().map { ($0.nameType, Array($0.contents)) } } ?? []
        guard Self.matches(self.expected, names: names) else {
            context.fireErrorCaught(NIOSSLExtraError.failedToValidateHostname)
            context.close(promise: nil)
            return
        }
        context.fireUserInboundEventTriggered(event)
        context.pipeline.syncOperations.removeHandler(context: context, promise: nil)
    }

    private static func peerCertificate(_ context: ChannelHandlerContext) -> NIOSSLCertificate? {
        guard let tls = try? context.pipeline.syncOperations.handler(type: NIOSSLClientHandler.self) else { return nil }
        return tls.peerCertificate
    }

    /// Whether a certificate with subject alternative names `names` is valid for `expected`. A certificate with none
    /// is valid for nothing (its common name is not looked at, as browsers do not).
    static func matches(_ expected: Expected, names: [(_SubjectAlternativeName.NameType, [UInt8])]) -> Bool {
        switch expected {
        case .address(let address):
            return names.contains { $0.0 == .ipAddress && $0.1 == address }
        case .name(let name):
            var asked = Array(name.lowercased().utf8)
            if asked.last == UInt8(ascii: ".") { asked.removeLast() }
            guard !asked.isEmpty else { return false }
            return names.contains {
                $0.0 == .dnsName && Self.dnsMatches(asked, pattern: Array(String(decoding: $0.1, as: UTF8.self).lowercased().utf8))
            }
        }
    }

    /// RFC 6125 §6.4.3: equal, or `*.rest` where the asked name's first label is replaced by `*` and the rest equal.
    static func dnsMatches(_ asked: [UInt8], pattern: [UInt8]) -> Bool {
        var pattern = pattern
        if pattern.last == UInt8(ascii: ".") { pattern.removeLast() }
        if pattern == asked { return true }
        guard pattern.count > 2, pattern[0] == UInt8(ascii: "*"), pattern[1] == UInt8(ascii: "."),
            let dot = asked.firstIndex(of: UInt8(ascii: ".")), dot > 0
        else { return false }
        let rest = Array(pattern.dropFirst(2))
        // A wildcard never stands for a whole registered name: "*.com" matches nothing.
        guard rest.contains(UInt8(ascii: ".")) else { return false }
        return Array(asked[(dot + 1)...]) == rest
    }

    private static func bytes(of address: SocketAddress) -> [UInt8]? {
        switch address {
        // The address bytes of `sockaddr_in` and `sockaddr_in6`, at their fixed places (RFC 3493 §3.3: family and port
        // first, then the IPv4 address; family, port and flow label, then the IPv6 address).
        case .v4(let v4):
            return withUnsafeBytes(of: v4.address) { Array($0[4..<8]) }
        case .v6(let v6):
            return withUnsafeBytes(of: v6.address) { Array($0[8..<24]) }
        case .unixDomainSocket:
            return nil
        }
    }
}

// Held by its channel and used on its event loop only (NIO handlers are not Sendable).
@available(*, unavailable)
extension ServerIdentityCheck: Sendable {}
