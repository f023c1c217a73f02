extension Duration {
    /// The duration in seconds, fractions included (for clocks and rates that count in `Double`).
    public var inSeconds: Double {
        Double(self.components.seconds) + Double(self.components.attoseconds) / 1e18
    }
}
