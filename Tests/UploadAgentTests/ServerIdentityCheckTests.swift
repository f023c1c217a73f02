import NIOSSL
import Testing

@testable import UploadAgent

/// The name the agent checks the relay's certificate against: the one the user gave, never the address it reached.
@Suite("Server identity")
struct ServerIdentityCheckTests {
    static let localhost: [(_SubjectAlternativeName.NameType, [UInt8])] = [
        (.dnsName, Array("localhost".utf8)), (.ipAddress, [127, 0, 0, 1]), (.ipAddress, [UInt8](repeating: 0, count: 15) + [1]),
    ]

    @Test("a name given is checked against the DNS names only: a certificate listing the address connected to does not pass for another name")
    func nameNotAddress() {
        #expect(ServerIdentityCheck.matches(.name("localhost"), names: Self.localhost))
        #expect(ServerIdentityCheck.matches(.name("LocalHost."), names: Self.localhost))
        #expect(!ServerIdentityCheck.matches(.name("wrong.example"), names: Self.localhost))
        #expect(ServerIdentityCheck.expected(host: "127.0.0.1", serverName: "wrong.example") == .name("wrong.example"))
    }

    @Test("an address given as the host, with no name, is checked against the IP addresses only")
    func address() {
        #expect(ServerIdentityCheck.expected(host: "127.0.0.1", serverName: nil) == .address([127, 0, 0, 1]))
        #expect(ServerIdentityCheck.matches(.address([127, 0, 0, 1]), names: Self.localhost))
        #expect(!ServerIdentityCheck.matches(.address([127, 0, 0, 2]), names: Self.localhost))
        #expect(!ServerIdentityCheck.matches(.address([127, 0, 0, 1]), names: [(.dnsName, Array("127.0.0.1".utf8))]))
        #expect(ServerIdentityCheck.expected(host: "relay.example", serverName: nil) == .name("relay.example"))
    }

    @Test("a wildcard stands for the leftmost label only, never for a registered name; no names, no match")
    func wildcards() {
        let wildcard: [(_SubjectAlternativeName.NameType, [UInt8])] = [(.dnsName, Array("*.relays.example".utf8))]
        #expect(ServerIdentityCheck.matches(.name("eu-1.relays.example"), names: wildcard))
        #expect(!ServerIdentityCheck.matches(.name("a.eu-1.relays.example"), names: wildcard))
        #expect(!ServerIdentityCheck.matches(.name("relays.example"), names: wildcard))
        #expect(!ServerIdentityCheck.matches(.name("x.com"), names: [(.dnsName, Array("*.com".utf8))]))
        #expect(!ServerIdentityCheck.matches(.name("localhost"), names: []))
    }
}
