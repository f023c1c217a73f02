import Foundation
import Testing
import UploadChecksums
import UploadProtocol
import UploadTestSupport

@testable import UploadRelay

/// `--dev`'s CA and server certificate, made with the system's libcrypto, checked by the openssl command: the chain
/// verifies, the names are the ones asked for (a name is never read as configuration text), the CA stays when the
/// names change, and the keys are private.
@Suite("Dev certificates from libcrypto")
struct DevCertificatesTests {
    /// Runs `openssl arguments`; its output and exit status.
    static func openssl(_ arguments: [String]) throws -> (output: String, status: Int32) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/openssl")
        process.arguments = arguments
        let pipe = Pipe()
        process.standardOutput = pipe
        process.standardError = pipe
        try process.run()
        let output = String(decoding: pipe.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        return (output, process.terminationStatus)
    }

    @Test(
        "the server certificate verifies against the CA for serverAuth, names every DNS name and IP address asked for, and the CA is kept when the names change"
    )
    func chainAndNames() async throws {
        let data = TemporaryDirectories.make()
        let paths = DevCertificates.Paths(dataDirectory: data)
        #expect(try DevCertificates.ensure(paths, names: ["relay.example.net", "10.1.2.3", "fd00::7", "odd,name=x"]))
        let verified = try Self.openssl(["verify", "-purpose", "sslserver", "-CAfile", paths.caCertificate, paths.serverCertificate])
        #expect(verified.status == 0, "\(verified.output)")
        let text = try Self.openssl(["x509", "-in", paths.serverCertificate, "-noout", "-text"]).output
        for name in [
            "DNS:localhost", "DNS:relay.example.net", "DNS:odd,name=x", "IP Address:127.0.0.1", "IP Address:0:0:0:0:0:0:0:1",
            "IP Address:10.1.2.3", "IP Address:FD00:0:0:0:0:0:0:7", "CA:FALSE", "TLS Web Server Authentication", "ecdsa-with-SHA256",
            "CN = relay.example.net",
        ] {
            #expect(text.contains(name), "\(name) missing from:\n\(text)")
        }
        let ca = try Self.openssl(["x509", "-in", paths.caCertificate, "-noout", "-text"]).output
        #expect(ca.contains("CA:TRUE, pathlen:0") && ca.contains("Certificate Sign, CRL Sign"), "\(ca)")
        // Private keys are the relay's alone.
        for key in [paths.caKey, paths.serverKey] {
            let mode = try FileManager.default.attributesOfItem(atPath: key)[.posixPermissions] as? Int
            #expect(mode == 0o600, "\(key): \(String(mode ?? 0, radix: 8))")
        }
        // Same names: nothing made again. Other names: a new server certificate from the same CA.
        let caBefore = try String(contentsOfFile: paths.caCertificate, encoding: .utf8)
        let serverBefore = try String(contentsOfFile: paths.serverCertificate, encoding: .utf8)
        #expect(try !DevCertificates.ensure(paths, names: ["relay.example.net", "10.1.2.3", "fd00::7", "odd,name=x"]))
        #expect(try DevCertificates.ensure(paths, names: ["other.example.net"]))
        #expect(try String(contentsOfFile: paths.caCertificate, encoding: .utf8) == caBefore)
        #expect(try String(contentsOfFile: paths.serverCertificate, encoding: .utf8) != serverBefore)
        #expect(try Self.openssl(["verify", "-CAfile", paths.caCertificate, paths.serverCertificate]).status == 0)
    }

    @Test("a CA key that cannot be read makes a new CA, never a certificate its ca.pem does not verify")
    func unreadableCAKey() async throws {
        let data = TemporaryDirectories.make()
        let paths = DevCertificates.Paths(dataDirectory: data)
        try DevCertificates.ensure(paths)
        let caBefore = try String(contentsOfFile: paths.caCertificate, encoding: .utf8)
        try "-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n".write(toFile: paths.caKey, atomically: true, encoding: .utf8)
        try FileManager.default.removeItem(atPath: paths.serverCertificate)
        #expect(try DevCertificates.ensure(paths))
        #expect(try String(contentsOfFile: paths.caCertificate, encoding: .utf8) != caBefore)
        #expect(try Self.openssl(["verify", "-CAfile", paths.caCertificate, paths.serverCertificate]).status == 0)
    }

    @Test("SHA-256 and HMAC-SHA-256 from libcrypto match FIPS 180-4's and RFC 4231's vectors")
    func sha256AndHMAC() async {
        #expect(SHA256.hash(Array("abc".utf8)).hexString == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        #expect(SHA256.hash([UInt8]()).hexString == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
        var split = SHA256()
        split.update(Array("a".utf8))
        split.update(Array("bc".utf8))
        #expect(split.finalize() == SHA256.hash(Array("abc".utf8)))
        // RFC 4231 test case 2.
        let code = HMACSHA256.authenticationCode(for: Array("what do ya want for nothing?".utf8), key: Array("Jefe".utf8))
        #expect(code.hexString == "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")
    }
}
