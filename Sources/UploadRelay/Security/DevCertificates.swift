import Crypto
import Foundation
import SwiftASN1
import X509

/// `upload-relay serve --dev`: a private CA and a server certificate for localhost, 127.0.0.1 and ::1.
public enum DevCertificates {
    /// The files `--dev` writes under `DIR/dev/`.
    public struct Paths: Sendable {
        public var directory: String
        public var caCertificate: String { self.directory + "/ca.pem" }
        public var serverCertificate: String { self.directory + "/server.pem" }
        public var serverKey: String { self.directory + "/server-key.pem" }
        public var token: String { self.directory + "/token" }

        public init(dataDirectory: String) {
            self.directory = dataDirectory + "/dev"
        }
    }

    /// Creates the CA and the server certificate unless they exist already. Returns whether it made them.
    @discardableResult
    public static func ensure(_ paths: Paths) throws -> Bool {
        let files = FileManager.default
        if files.fileExists(atPath: paths.caCertificate) && files.fileExists(atPath: paths.serverCertificate)
            && files.fileExists(atPath: paths.serverKey)
        {
            return false
        }
        try files.createDirectory(atPath: paths.directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        let now = Date()
        let caKey = P256.Signing.PrivateKey()
        let caName = try DistinguishedName {
            OrganizationName("upload-relay dev")
            CommonName("upload-relay dev CA")
        }
        let ca = try Certificate(
            version: .v3, serialNumber: Certificate.SerialNumber(), publicKey: .init(caKey.publicKey),
            notValidBefore: now.addingTimeInterval(-3600), notValidAfter: now.addingTimeInterval(3650 * 86400),
            issuer: caName, subject: caName, signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.isCertificateAuthority(maxPathLength: 0))
                Critical(KeyUsage(keyCertSign: true, cRLSign: true))
            },
            issuerPrivateKey: .init(caKey)
        )
        let serverKey = P256.Signing.PrivateKey()
        let serverName = try DistinguishedName {
            OrganizationName("upload-relay dev")
            CommonName("localhost")
        }
        let server = try Certificate(
            version: .v3, serialNumber: Certificate.SerialNumber(), publicKey: .init(serverKey.publicKey),
            notValidBefore: now.addingTimeInterval(-3600), notValidAfter: now.addingTimeInterval(825 * 86400),
            issuer: caName, subject: serverName, signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.notCertificateAuthority)
                Critical(KeyUsage(digitalSignature: true))
                try ExtendedKeyUsage([.serverAuth])
                SubjectAlternativeNames([
                    .dnsName("localhost"), .ipAddress(ASN1OctetString(contentBytes: [127, 0, 0, 1])),
                    .ipAddress(ASN1OctetString(contentBytes: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1])),
                ])
            },
            issuerPrivateKey: .init(caKey)
        )
        try self.write(try ca.serializeAsPEM().pemString + "\n", to: paths.caCertificate, mode: 0o644)
        try self.write(try server.serializeAsPEM().pemString + "\n", to: paths.serverCertificate, mode: 0o644)
        try self.write(serverKey.pemRepresentation + "\n", to: paths.serverKey, mode: 0o600)
        return true
    }

    static func write(_ text: String, to path: String, mode: Int) throws {
        let temporary = path + ".tmp"
        guard FileManager.default.createFile(atPath: temporary, contents: Data(text.utf8), attributes: [.posixPermissions: mode]) else {
            throw CocoaError(.fileWriteUnknown, userInfo: [NSFilePathErrorKey: temporary])
        }
        guard rename(temporary, path) == 0 else {
            throw CocoaError(.fileWriteUnknown, userInfo: [NSFilePathErrorKey: path])
        }
    }
}
